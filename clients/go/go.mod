module ringlock

go 1.22
