//! [`Clusters`]: one client over several independent clusters, each key
//! sent to the cluster chosen for it by rendezvous hashing over the
//! clusters' names (docs/protocol.md §4, "Several clusters"), and
//! [`cluster_for`], the choice itself.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::client::Client;
use crate::error::{BadArgument, Error};
use crate::lock::{Lock, ReleaseOutcome};
use crate::operation::Inspection;
use crate::proto::cluster_index;

/// Most clusters a [`Clusters`] takes: every request scores its key on
/// each of them.
pub const CLUSTERS_MAX: usize = 1024;

/// The name, among `names`, of the cluster `key` goes to: the highest
/// score `fmix64(fnv1a64(name ++ 0xFF ++ key))`, a tie going to the name
/// first in byte order (docs/protocol.md §4). Every ringlock client chooses
/// the same cluster for the same key and names, whatever their order.
/// `None` only when `names` is empty.
///
/// # Examples
///
/// ```
/// use ringlock_client::cluster_for;
///
/// // clients/cluster-hash-vectors.json: "invoice-42" over east, west, north.
/// assert_eq!(cluster_for(&["east", "west", "north"], "invoice-42"), Some("east"));
/// assert_eq!(cluster_for(&["north", "west", "east"], "invoice-42"), Some("east"));
/// assert_eq!(cluster_for(&[], "invoice-42"), None);
/// ```
pub fn cluster_for<'a>(names: &[&'a str], key: impl AsRef<[u8]>) -> Option<&'a str> {
    cluster_index(names, key.as_ref()).map(|index| names[index])
}

/// A client of several independent ringlock clusters, each given by name:
/// every request about a key goes to the key's cluster ([`cluster_for`]
/// over the names), so each cluster serves its own share of the keys and
/// throughput adds up over the clusters.
///
/// Each cluster is a [`Client`] of its own nodes, built as usual (the same
/// settings or not); a [`Lock`] belongs to its cluster's client and is
/// extended and released there. Fencing tokens come from the key's own
/// cluster, so tokens of keys in different clusters are not comparable.
///
/// Taking a cluster out of the list moves its keys to the others, where
/// they are free: drain it first (docs/protocol.md §4): stop taking new
/// locks on its keys, let its holders release or their leases end until
/// its `S` shows no held keys ([`Client::stats`]), then build every
/// application's `Clusters` without it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use ringlock_client::{Client, Clusters};
///
/// # fn main() -> Result<(), ringlock_client::Error> {
/// let clusters = Clusters::new([
///     ("east", Client::connect(["10.0.1.1:7700", "10.0.1.2:7700"])?),
///     ("west", Client::connect(["10.0.2.1:7700", "10.0.2.2:7700"])?),
/// ])?;
/// println!("orders/42 lives on {}", clusters.name_for("orders/42"));
/// if let Some(lock) = clusters.acquire("orders/42", Duration::from_secs(30), Some(Duration::from_secs(5)))? {
///     println!("token {} (of that cluster)", lock.token());
///     lock.release()?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Clusters {
    names: Vec<String>,
    clients: Vec<Client>,
}

impl fmt::Debug for Clusters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.names.iter().zip(&self.clients)).finish()
    }
}

impl Clusters {
    /// Several clusters, each a name and a [`Client`] of its nodes.
    ///
    /// # Errors
    ///
    /// [`Error::BadArgument`] with [`BadArgument::Setting`] when no cluster
    /// is given, more than [`CLUSTERS_MAX`], a name is empty, or two have
    /// the same name.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_client::{BadArgument, Client, Clusters, Error};
    ///
    /// # fn main() -> Result<(), Error> {
    /// let client = Client::connect(["127.0.0.1:7700"])?;
    /// let error = Clusters::new([("a", client.clone()), ("a", client)]).unwrap_err();
    /// assert_eq!(error, Error::BadArgument(BadArgument::Setting("two clusters have the same name")));
    /// # Ok(())
    /// # }
    /// ```
    pub fn new<I, N>(clusters: I) -> Result<Clusters, Error>
    where
        I: IntoIterator<Item = (N, Client)>,
        N: Into<String>,
    {
        let (names, clients): (Vec<String>, Vec<Client>) =
            clusters.into_iter().map(|(name, client)| (name.into(), client)).unzip();
        let refuse = |why: &'static str| Err(Error::BadArgument(BadArgument::Setting(why)));
        if names.is_empty() {
            return refuse("give Clusters at least one cluster");
        }
        if names.len() > CLUSTERS_MAX {
            return refuse("give Clusters at most 1024 clusters");
        }
        if names.iter().any(String::is_empty) {
            return refuse("a cluster's name must not be empty");
        }
        let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
            return refuse("two clusters have the same name");
        }
        Ok(Clusters { names, clients })
    }

    fn index_for(&self, key: &[u8]) -> usize {
        cluster_index(&self.names, key).expect("Clusters::new refuses an empty list")
    }

    /// The client of the cluster `key` goes to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # let clusters = ringlock_client::Clusters::new([("a", ringlock_client::Client::connect(["127.0.0.1:7700"])?)])?;
    /// let pong = clusters.client_for("orders/42").ping()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn client_for(&self, key: impl AsRef<[u8]>) -> &Client {
        &self.clients[self.index_for(key.as_ref())]
    }

    /// The name of the cluster `key` goes to.
    ///
    /// # Examples
    ///
    /// ```
    /// use ringlock_client::{Client, Clusters};
    ///
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// let clusters = Clusters::new([
    ///     ("east", Client::connect(["127.0.0.1:7701"])?),
    ///     ("west", Client::connect(["127.0.0.1:7702"])?),
    ///     ("north", Client::connect(["127.0.0.1:7703"])?),
    /// ])?;
    /// assert_eq!(clusters.name_for("invoice-42"), "east");
    /// # Ok(())
    /// # }
    /// ```
    pub fn name_for(&self, key: impl AsRef<[u8]>) -> &str {
        &self.names[self.index_for(key.as_ref())]
    }

    /// The clusters' names, in the order given.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?), ("b", Client::connect(["127.0.0.1:7702"])?)])?;
    /// assert_eq!(clusters.names().collect::<Vec<_>>(), ["a", "b"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The client of the cluster called `name`, if there is one: for what
    /// concerns a cluster rather than a key (its `S` while draining it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("b", Client::connect(["127.0.0.1:7702"])?)])?;
    /// let json = clusters.client("b").expect("a cluster called b").stats()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn client(&self, name: &str) -> Option<&Client> {
        self.names.iter().position(|known| known == name).map(|index| &self.clients[index])
    }

    /// [`Client::acquire`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?)])?;
    /// if let Some(lock) = clusters.acquire("reports/daily", Duration::from_secs(60), Some(Duration::from_secs(1)))? {
    ///     lock.release()?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Option<Lock>, Error> {
        self.client_for(key.as_ref()).acquire(key, lease, wait)
    }

    /// [`Client::try_acquire`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?)])?;
    /// if let Some(_lock) = clusters.try_acquire("cron/cleanup", Duration::from_secs(60))? {
    ///     // ... the critical section ...
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire(&self, key: impl AsRef<[u8]>, lease: Duration) -> Result<Option<Lock>, Error> {
        self.client_for(key.as_ref()).try_acquire(key, lease)
    }

    /// [`Client::acquire_async`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run(clusters: ringlock_client::Clusters) -> Result<(), ringlock_client::Error> {
    /// if let Some(lock) = clusters.acquire_async("orders/42", Duration::from_secs(30), None).await? {
    ///     lock.release_async().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_async(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Lock>, Error>> + Send + 'static {
        self.client_for(key.as_ref()).acquire_async(key, lease, wait)
    }

    /// [`Client::try_acquire_async`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn run(clusters: ringlock_client::Clusters) -> Result<(), ringlock_client::Error> {
    /// let lock = clusters.try_acquire_async("cron/cleanup", Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire_async(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
    ) -> impl Future<Output = Result<Option<Lock>, Error>> + Send + 'static {
        self.client_for(key.as_ref()).try_acquire_async(key, lease)
    }

    /// [`Client::lock_from`] with the key's cluster's client: a [`Lock`]
    /// for a grant taken elsewhere, from its key and token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?)])?;
    /// let lock = clusters.lock_from("deploy", 17_592_186_044_416, Duration::from_secs(30))?;
    /// lock.release()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_from(&self, key: impl AsRef<[u8]>, token: u64, lease: Duration) -> Result<Lock, Error> {
        self.client_for(key.as_ref()).lock_from(key, token, lease)
    }

    /// [`Client::inspect`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?)])?;
    /// let waiters = clusters.inspect("orders/42")?.waiters;
    /// # Ok(())
    /// # }
    /// ```
    pub fn inspect(&self, key: impl AsRef<[u8]>) -> Result<Inspection, Error> {
        self.client_for(key.as_ref()).inspect(key)
    }

    /// [`Client::inspect_async`] on the key's cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(clusters: ringlock_client::Clusters) -> Result<(), ringlock_client::Error> {
    /// let state = clusters.inspect_async("orders/42").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn inspect_async(
        &self,
        key: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Inspection, Error>> + Send + 'static {
        self.client_for(key.as_ref()).inspect_async(key)
    }

    /// [`Client::release`] on the key's cluster: releases the grant of
    /// `key` with `token`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringlock_client::Error> {
    /// # use ringlock_client::{Client, Clusters};
    /// # let clusters = Clusters::new([("a", Client::connect(["127.0.0.1:7701"])?)])?;
    /// let outcome = clusters.release("cron/cleanup", 17_592_186_044_416)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<ReleaseOutcome, Error> {
        self.client_for(key.as_ref()).release(key, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Just enough JSON for clients/cluster-hash-vectors.json: objects,
    /// arrays and strings (no escapes in the file's vectors).
    #[derive(Debug)]
    enum Json {
        Text(String),
        List(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    impl Json {
        fn get(&self, name: &str) -> &Json {
            match self {
                Json::Object(fields) => &fields.iter().find(|(key, _)| key == name).expect(name).1,
                other => panic!("{other:?} is no object"),
            }
        }

        fn text(&self) -> &str {
            match self {
                Json::Text(text) => text,
                other => panic!("{other:?} is no string"),
            }
        }

        fn list(&self) -> &[Json] {
            match self {
                Json::List(items) => items,
                other => panic!("{other:?} is no list"),
            }
        }
    }

    fn parse(input: &mut &str) -> Json {
        *input = input.trim_start();
        let first = input.chars().next().expect("a value");
        *input = &input[1..];
        match first {
            '"' => {
                let end = input.find('"').expect("the end of a string");
                let text = input[..end].to_string();
                assert!(!text.contains('\\'), "no escapes expected");
                *input = &input[end + 1..];
                Json::Text(text)
            }
            '[' | '{' => {
                let (close, object) = if first == '[' { (']', false) } else { ('}', true) };
                let (mut items, mut fields) = (Vec::new(), Vec::new());
                loop {
                    *input = input.trim_start();
                    if let Some(rest) = input.strip_prefix(close) {
                        *input = rest;
                        break;
                    }
                    if let Some(rest) = input.strip_prefix(',') {
                        *input = rest;
                        continue;
                    }
                    if object {
                        let Json::Text(name) = parse(input) else { panic!("a field name") };
                        *input = input.trim_start().strip_prefix(':').expect("a colon");
                        fields.push((name, parse(input)));
                    } else {
                        items.push(parse(input));
                    }
                }
                if object { Json::Object(fields) } else { Json::List(items) }
            }
            other => panic!("unexpected {other:?} in the vectors file"),
        }
    }

    fn bytes_of_hex(hex: &str) -> Vec<u8> {
        (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex")).collect()
    }

    #[test]
    fn every_vector_of_the_reference_gives_its_scores_and_choice() {
        let mut text = include_str!("../../clients/cluster-hash-vectors.json");
        let vectors = parse(&mut text);
        let vectors = vectors.get("vectors").list();
        assert_eq!(vectors.len(), 28, "four sets of names by seven keys");
        for vector in vectors {
            let names: Vec<&str> = vector.get("clusters").list().iter().map(Json::text).collect();
            let key = bytes_of_hex(vector.get("key_hex").text());
            for (name, score) in names.iter().zip(vector.get("scores_hex").list()) {
                let expected = u64::from_str_radix(score.text(), 16).expect("a hex score");
                assert_eq!(crate::proto::cluster_score(name.as_bytes(), &key), expected, "{name} {key:x?}");
            }
            let chosen = vector.get("chosen").text();
            assert_eq!(cluster_for(&names, &key), Some(chosen), "{names:?} {key:x?}");
            let mut reversed = names.clone();
            reversed.reverse();
            assert_eq!(cluster_for(&reversed, &key), Some(chosen), "the order of the names does not matter");
        }
    }

    #[test]
    fn clusters_refuse_no_name_an_empty_name_and_a_name_twice() {
        let client = || Client::connect(["127.0.0.1:1"]).unwrap();
        let setting = |result: Result<Clusters, Error>| match result {
            Err(Error::BadArgument(BadArgument::Setting(why))) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(setting(Clusters::new(Vec::<(String, Client)>::new())), "give Clusters at least one cluster");
        assert_eq!(setting(Clusters::new([("", client())])), "a cluster's name must not be empty");
        assert_eq!(
            setting(Clusters::new([("b", client()), ("a", client()), ("b", client())])),
            "two clusters have the same name"
        );
        let clusters = Clusters::new([("west", client()), ("east", client()), ("north", client())]).unwrap();
        assert_eq!(clusters.name_for("invoice-42"), "east");
        assert!(clusters.client("south").is_none());
        assert!(std::ptr::eq(clusters.client_for("invoice-42"), clusters.client("east").unwrap()));
    }
}
