module ringlock.dev/ringlock

go 1.22
