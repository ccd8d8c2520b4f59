//! `ringlock-bench`: the load generator of ringlock.
//!
//! # Layout
//! - `cli`: the flags of `run`, `echo-server` and `report`.
//! - `run`: one run: connection plan, workers, phases, server sampling.
//! - `worker`: one thread's io_uring loop, its connections and lanes.
//! - `open_loop`: the timetable of `run --rate` and how well it was kept.
//! - `pending`: pairing replies with requests by (op, key) per connection.
//! - `wire`: what each target is sent and how its replies read.
//! - `tls`: TLS and the secret: opening a connection, sealing batches.
//! - `connect_rate`: `connect-rate`, new connections per second.
//! - `resp`: the small part of the Redis protocol a lock needs.
//! - `keys`: fixed-length keys that give back their number.
//! - `echo_server`: the loopback ceiling server.
//! - `proc_sample`: CPU and RSS of a process from /proc.
//! - `report`: a run's report, and the side-by-side report of many.

mod cli;
mod connect_rate;
mod echo_server;
mod keys;
mod open_loop;
mod pending;
mod proc_sample;
mod report;
mod resp;
mod run;
mod tls;
mod wire;
mod worker;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Run(args) => run::run(&args).and_then(|report| {
            if args.json {
                serde_json::to_string_pretty(&report).map(|json| println!("{json}")).map_err(|error| error.to_string())
            } else {
                print!("{}", report.text());
                Ok(())
            }
        }),
        cli::Command::EchoServer(args) => echo(&args),
        cli::Command::ConnectRate(args) => connect_rate::run(&args).and_then(|report| {
            if args.json {
                serde_json::to_string_pretty(&report).map(|json| println!("{json}")).map_err(|error| error.to_string())
            } else {
                println!("{}", report.text());
                Ok(())
            }
        }),
        cli::Command::Report(args) => report::report(&args).map(|table| print!("{table}")),
    };
    if let Err(error) = result {
        eprintln!("ringlock-bench: {error}");
        std::process::exit(1);
    }
}

fn echo(args: &cli::EchoArgs) -> Result<(), String> {
    if let Some(cpu) = args.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        return Err(format!("cannot pin the echo server to CPU {cpu}"));
    }
    let (server, local) = echo_server::EchoServer::bind(args.listen, std::time::Duration::from_micros(args.poll_us))
        .map_err(|error| error.to_string())?;
    eprintln!("listening on {local}");
    server.run().map_err(|error| format!("echo server stopped: {error}"))
}
