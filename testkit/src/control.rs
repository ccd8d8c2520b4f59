//! The control protocol of `ringlock-testkit`: one command per line, one
//! reply line each, `ok …` or `err <reason>` (`testkit/README.md` lists the
//! commands). Each control connection is served by its own thread, so a
//! wait on one does not hold the others.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{FakeStandby, Names, Proxy};

/// A proxy or a fake standby the kit runs.
#[derive(Clone)]
enum Item {
    Proxy(Arc<Proxy>),
    Fake(Arc<FakeStandby>),
}

/// Everything one kit runs, by id.
#[derive(Clone, Default)]
pub struct Kit {
    items: Arc<Mutex<HashMap<u32, Item>>>,
    next_id: Arc<AtomicU32>,
}

impl Kit {
    /// Serves control connections from `listener` for as long as it lasts.
    pub fn serve(&self, listener: &TcpListener) {
        for stream in listener.incoming().flatten() {
            let kit = self.clone();
            std::thread::spawn(move || kit.serve_connection(stream));
        }
    }

    fn serve_connection(&self, stream: TcpStream) {
        let Ok(mut writer) = stream.try_clone() else { return };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            let reply = match self.execute(line.trim_end_matches('\r')) {
                Ok(fields) if fields.is_empty() => "ok\n".to_string(),
                Ok(fields) => format!("ok {fields}\n"),
                Err(reason) => format!("err {reason}\n"),
            };
            if writer.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    }

    /// Carries out one command line; the reply's fields after `ok`, or why not.
    pub fn execute(&self, line: &str) -> Result<String, String> {
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        let mut fields = rest.split(' ').filter(|field| !field.is_empty());
        let mut next = |what: &str| fields.next().ok_or_else(|| format!("{command} needs {what}"));
        match command {
            "ping" => Ok(String::new()),
            "proxy" => {
                let target = address(next("a target address")?)?;
                let proxy = Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target)
                    .map_err(|error| format!("cannot start a proxy: {error}"))?;
                let addr = proxy.addr;
                Ok(format!("{} {addr}", self.add(Item::Proxy(Arc::new(proxy)))))
            }
            "fake" => {
                let names = names(next("an active address or -")?)?;
                let fake = FakeStandby::try_start(names).map_err(|error| format!("cannot start a fake: {error}"))?;
                let addr = fake.addr;
                Ok(format!("{} {addr}", self.add(Item::Fake(Arc::new(fake)))))
            }
            "fake-active" => {
                let fake = self.fake(next("an id")?)?;
                fake.set_names(names(next("an active address or -")?)?);
                Ok(String::new())
            }
            "target" => {
                let proxy = self.proxy(next("an id")?)?;
                proxy.set_target(address(next("a target address")?)?);
                Ok(String::new())
            }
            "accepted" => match self.item(next("an id")?)? {
                Item::Proxy(proxy) => Ok(proxy.accepted().to_string()),
                Item::Fake(fake) => Ok(fake.accepted().to_string()),
            },
            "refused" => Ok(self.proxy(next("an id")?)?.refused().to_string()),
            "attempts" => {
                let times = self.proxy(next("an id")?)?.attempt_times();
                let listed: Vec<String> =
                    times.iter().map(|time| format!("{:.3}", time.as_secs_f64() * 1000.0)).collect();
                Ok(format!("{} {}", times.len(), listed.join(" ")).trim_end().to_string())
            }
            "wait-attempts" => {
                let proxy = self.proxy(next("an id")?)?;
                let count = number(next("a count")?)?;
                proxy.try_wait_until(&format!("{count} connection attempts"), |proxy| {
                    proxy.attempt_times().len() >= count
                })?;
                Ok(String::new())
            }
            "redirected" => Ok(self.fake(next("an id")?)?.redirected().to_string()),
            "open" => {
                let ids = self.proxy(next("an id")?)?.open_ids();
                let listed: Vec<String> = ids.iter().map(ToString::to_string).collect();
                Ok(format!("{} {}", ids.len(), listed.join(" ")).trim_end().to_string())
            }
            "wait-open" => {
                let proxy = self.proxy(next("an id")?)?;
                let count = number(next("a count")?)?;
                proxy.try_wait_until(&format!("{count} open connections"), |proxy| proxy.open_count() == count)?;
                Ok(String::new())
            }
            "wait-accepted" => {
                let proxy = self.proxy(next("an id")?)?;
                let count = number(next("a count")?)?;
                proxy.try_wait_until(&format!("{count} accepted connections"), |proxy| proxy.accepted() >= count)?;
                Ok(String::new())
            }
            "wait-upstream" => {
                let proxy = self.proxy(next("an id")?)?;
                let except = next("connections to pass over, or -")?;
                let except: Vec<usize> = match except {
                    "-" => Vec::new(),
                    list => list.split(',').map(number).collect::<Result<_, _>>()?,
                };
                // The text is the rest of the line, spaces included.
                let text = rest.splitn(3, ' ').nth(2).filter(|text| !text.is_empty());
                let text = text.ok_or_else(|| "wait-upstream needs a text".to_string())?;
                Ok(proxy.try_wait_upstream(text.as_bytes(), &except)?.to_string())
            }
            "cut" => {
                let proxy = self.proxy(next("an id")?)?;
                match fields.next() {
                    Some(connection) => proxy.cut(number(connection)?),
                    None => proxy.cut_all(),
                }
                Ok(String::new())
            }
            "refuse" => {
                let proxy = self.proxy(next("an id")?)?;
                proxy.set_refusing(on_off(next("on or off")?)?);
                Ok(String::new())
            }
            "stall" => self.proxy(next("an id")?).map(|proxy| proxy.stall()).map(|()| String::new()),
            "stall-replies" => self.proxy(next("an id")?).map(|proxy| proxy.stall_replies()).map(|()| String::new()),
            "resume" => self.proxy(next("an id")?).map(|proxy| proxy.resume()).map(|()| String::new()),
            "delay" => {
                let proxy = self.proxy(next("an id")?)?;
                proxy.delay_replies(Duration::from_millis(number(next("milliseconds")?)? as u64));
                Ok(String::new())
            }
            "reorder" => {
                let proxy = self.proxy(next("an id")?)?;
                proxy.set_reordering(on_off(next("on or off")?)?);
                Ok(String::new())
            }
            "blackhole" => {
                let proxy = self.proxy(next("an id")?)?;
                let on = on_off(next("on or off")?)?;
                match (on, fields.next().map(number).transpose()?) {
                    (true, None) => proxy.blackhole(),
                    (true, Some(connection)) => proxy.blackhole_one(connection),
                    (false, None) => proxy.lift_blackhole(),
                    (false, Some(connection)) => proxy.lift_blackhole_one(connection),
                }
                Ok(String::new())
            }
            "blackholed" => {
                let ids = self.proxy(next("an id")?)?.blackholed_ids();
                let listed: Vec<String> = ids.iter().map(ToString::to_string).collect();
                Ok(format!("{} {}", ids.len(), listed.join(" ")).trim_end().to_string())
            }
            "close" => {
                let id = number(next("an id")?)? as u32;
                self.items.lock().unwrap().remove(&id).map(|_| String::new()).ok_or_else(|| format!("no item {id}"))
            }
            "" => Err("empty command".to_string()),
            other => Err(format!("unknown command {other:?}")),
        }
    }

    fn add(&self, item: Item) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.items.lock().unwrap().insert(id, item);
        id
    }

    /// The proxy or the fake of `id` (held outside the table's lock, so a
    /// long wait on it does not stop other commands).
    fn item(&self, id: &str) -> Result<Item, String> {
        let id = number(id)? as u32;
        self.items.lock().unwrap().get(&id).cloned().ok_or_else(|| format!("no item {id}"))
    }

    fn proxy(&self, id: &str) -> Result<Arc<Proxy>, String> {
        match self.item(id)? {
            Item::Proxy(proxy) => Ok(proxy),
            Item::Fake(_) => Err(format!("item {id} is not a proxy")),
        }
    }

    fn fake(&self, id: &str) -> Result<Arc<FakeStandby>, String> {
        match self.item(id)? {
            Item::Fake(fake) => Ok(fake),
            Item::Proxy(_) => Err(format!("item {id} is not a fake")),
        }
    }
}

fn address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:7700"))
}

fn names(text: &str) -> Result<Names, String> {
    if text == "-" { Ok(Names::NoActive) } else { address(text).map(Names::Active) }
}

fn number(text: &str) -> Result<usize, String> {
    text.parse().map_err(|_| format!("{text:?} is not a number"))
}

fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?} is neither on nor off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_answer_ok_with_their_fields_or_err_with_a_reason() {
        let kit = Kit::default();
        assert_eq!(kit.execute("ping"), Ok(String::new()));
        let target = TcpListener::bind("127.0.0.1:0").unwrap();
        let started = kit.execute(&format!("proxy {}", target.local_addr().unwrap())).unwrap();
        let (id, addr) = started.split_once(' ').unwrap();
        assert_eq!(id, "0");
        let _client = TcpStream::connect(addr).unwrap();
        assert_eq!(kit.execute("wait-accepted 0 1"), Ok(String::new()));
        assert_eq!(kit.execute("wait-attempts 0 1"), Ok(String::new()));
        let attempts = kit.execute("attempts 0").unwrap();
        let (count, time) = attempts.split_once(' ').unwrap();
        assert_eq!(count, "1");
        assert!(time.parse::<f64>().unwrap() >= 0.0, "{attempts}");
        assert_eq!(kit.execute("open 0"), Ok("1 0".to_string()));
        assert_eq!(kit.execute("cut 0"), Ok(String::new()));
        assert_eq!(kit.execute("wait-open 0 0"), Ok(String::new()));
        assert_eq!(kit.execute("open 0"), Ok("0".to_string()));
        assert!(kit.execute("redirected 0").unwrap_err().contains("not a fake"));
        assert!(kit.execute("fake nowhere").unwrap_err().contains("not an address"));
        assert!(kit.execute("refuse 0 maybe").unwrap_err().contains("neither on nor off"));
        assert!(kit.execute("stall 9").unwrap_err().contains("no item 9"));
        assert!(kit.execute("wait-upstream 0 -").unwrap_err().contains("needs a text"));
        assert!(kit.execute("launch").unwrap_err().contains("unknown command"));
        assert_eq!(kit.execute("close 0"), Ok(String::new()));
        assert!(kit.execute("close 0").is_err());
    }
}
