//! The rules a standby applies to the table frames an active sends it: a
//! snapshot in slices with the deltas made meanwhile between them, then the
//! delta stream, each delta numbered one above the last.
//!
//! Pure: no I/O, no clock (every input carries `now_ms`), no log. The
//! replication core hands it the frames of its peer connections and tells
//! the cluster logic what [`Received`] says; a peer's stream that breaks a
//! rule ([`Break`]) is dropped, and the standby asks for a new snapshot.
//!
//! The rules hold for any [`ReplicaTable`]: the replication core's is its
//! mirror of the lock table, and the cluster simulator (`sim`) drives the
//! same rules with its abstract table, through crashes, cuts and lost frames.

use std::fmt::Debug;

use super::TableVersion;

/// What the receive rules need of a replicated table.
pub trait ReplicaTable {
    /// One key's state in a snapshot; it replaces what the table has for the key.
    type Entry;
    /// One change of the active's table.
    type Delta;
    /// Why the table refused a change.
    type Refused: Debug + PartialEq + Eq;

    fn empty() -> Self;
    fn insert(&mut self, now_ms: u64, entry: Self::Entry);
    fn apply(&mut self, now_ms: u64, delta: Self::Delta) -> Result<(), Self::Refused>;
    /// Grants held.
    fn len(&self) -> usize;
    /// The highest epoch of any token applied, for the cluster logic.
    fn token_epoch_max(&self) -> u64;
}

/// The stream this node applies as a standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Replica {
    from: usize,
    connection: u64,
    table: TableVersion,
}

/// A snapshot being received: its table so far, and the version the deltas
/// received between its slices brought it to.
struct Incoming<T> {
    from: usize,
    connection: u64,
    table: TableVersion,
    mirror: T,
}

/// What a frame did, for the cluster logic.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<Refused> {
    /// Not of the stream or snapshot under way (or this node serves): dropped.
    Ignored,
    /// A snapshot began.
    SnapshotBegun,
    /// A snapshot under way took entries or deltas.
    SnapshotProgress,
    /// A snapshot is complete: the table is at `table`.
    SnapshotApplied { table: TableVersion, grants: usize, token_epoch_max: u64 },
    /// Deltas of the stream are applied: the table is at `table`.
    Applied { table: TableVersion, token_epoch_max: u64 },
    /// The stream or snapshot from this peer broke a rule and is dropped.
    Broken(Break<Refused>),
}

/// The rule a stream or snapshot broke.
#[derive(Debug, PartialEq, Eq)]
pub enum Break<Refused> {
    /// Deltas between a snapshot's slices that do not follow its version, or
    /// that the table refused.
    SnapshotOutOfOrder { stream: u64, first_version: u64 },
    /// Deltas that do not follow the stream's last version.
    Gap { stream: u64, first_version: u64 },
    /// A delta the table refused (a grant whose token is not above the key's).
    OutOfOrder(Refused),
    /// The table would hold more grants than `--max-keys`.
    Overflow { what: &'static str },
}

/// A standby's receiving side of the replication stream. See the module
/// documentation.
pub struct StreamReceiver<T: ReplicaTable> {
    replica: Option<Replica>,
    incoming: Option<Incoming<T>>,
}

impl<T: ReplicaTable> Default for StreamReceiver<T> {
    fn default() -> Self {
        StreamReceiver { replica: None, incoming: None }
    }
}

impl<T: ReplicaTable> StreamReceiver<T> {
    /// The table the applied stream has reached, if one is applied.
    pub fn replica_table(&self) -> Option<TableVersion> {
        self.replica.map(|replica| replica.table)
    }

    /// The peer whose stream is applied, if one is (for the simulator).
    #[cfg(test)]
    pub fn replica_from(&self) -> Option<usize> {
        self.replica.map(|replica| replica.from)
    }

    /// Forgets the stream and any snapshot under way (the node serves now).
    pub fn clear(&mut self) {
        self.replica = None;
        self.incoming = None;
    }

    /// The connection `connection` from `from` closed; true if it carried the
    /// applied stream, which is then broken.
    pub fn connection_closed(&mut self, from: usize, connection: u64) -> bool {
        if self.incoming.as_ref().is_some_and(|incoming| incoming.from == from && incoming.connection == connection) {
            self.incoming = None;
        }
        if self.is_replica(from, connection) {
            self.replica = None;
            return true;
        }
        false
    }

    /// A snapshot starts at `table`. A node that serves takes none.
    pub fn snapshot_begin(
        &mut self,
        from: usize,
        connection: u64,
        table: TableVersion,
        serving: bool,
    ) -> Received<T::Refused> {
        if serving {
            return Received::Ignored;
        }
        // The deltas on this connection belong to the new snapshot from here on.
        if self.is_replica(from, connection) {
            self.replica = None;
        }
        self.incoming = Some(Incoming { from, connection, table, mirror: T::empty() });
        Received::SnapshotBegun
    }

    /// Entries of the snapshot under way.
    pub fn snapshot_chunk(
        &mut self,
        now_ms: u64,
        from: usize,
        connection: u64,
        entries: impl IntoIterator<Item = T::Entry>,
        keys_max: usize,
    ) -> Received<T::Refused> {
        let Some(incoming) = self.incoming_of(from, connection) else { return Received::Ignored };
        for entry in entries {
            incoming.mirror.insert(now_ms, entry);
        }
        if incoming.mirror.len() > keys_max {
            return self.overflow("snapshot");
        }
        Received::SnapshotProgress
    }

    /// The snapshot under way is complete at `table`: if it is the one from
    /// this connection, it becomes `mirror`, and the stream applied.
    pub fn snapshot_end(
        &mut self,
        from: usize,
        connection: u64,
        table: TableVersion,
        serving: bool,
        mirror: &mut T,
    ) -> Received<T::Refused> {
        let Some(incoming) = self.incoming.take() else { return Received::Ignored };
        if incoming.from != from || incoming.connection != connection || incoming.table != table || serving {
            return Received::Ignored;
        }
        *mirror = incoming.mirror;
        self.replica = Some(Replica { from, connection, table });
        Received::SnapshotApplied { table, grants: mirror.len(), token_epoch_max: mirror.token_epoch_max() }
    }

    /// Deltas numbered from `first_version`: between a snapshot's slices they
    /// go into the snapshot, after it into `mirror`.
    #[allow(clippy::too_many_arguments)]
    pub fn deltas(
        &mut self,
        now_ms: u64,
        from: usize,
        connection: u64,
        stream: u64,
        first_version: u64,
        deltas: impl IntoIterator<Item = T::Delta>,
        keys_max: usize,
        mirror: &mut T,
    ) -> Received<T::Refused> {
        if let Some(incoming) = self.incoming_of(from, connection) {
            let in_order = incoming.table.stream == stream && first_version == incoming.table.version + 1;
            let mut count = 0;
            let mut applied = in_order;
            for delta in deltas {
                count += 1;
                // Out of order, the rest is only counted.
                applied = applied && incoming.mirror.apply(now_ms, delta).is_ok();
            }
            incoming.table.version += count;
            if incoming.mirror.len() > keys_max {
                return self.overflow("snapshot");
            }
            if !applied {
                self.incoming = None;
                return Received::Broken(Break::SnapshotOutOfOrder { stream, first_version });
            }
            return Received::SnapshotProgress;
        }
        let Some(replica) =
            self.replica.as_mut().filter(|replica| replica.from == from && replica.connection == connection)
        else {
            return Received::Ignored;
        };
        if replica.table.stream != stream || first_version != replica.table.version + 1 {
            self.replica = None;
            return Received::Broken(Break::Gap { stream, first_version });
        }
        for delta in deltas {
            replica.table.version += 1;
            if let Err(error) = mirror.apply(now_ms, delta) {
                // Not an active's stream as it should be: start over from a
                // snapshot rather than trust the rest of it.
                self.replica = None;
                return Received::Broken(Break::OutOfOrder(error));
            }
        }
        let table = replica.table;
        if mirror.len() > keys_max {
            return self.overflow("replication stream");
        }
        Received::Applied { table, token_epoch_max: mirror.token_epoch_max() }
    }

    fn is_replica(&self, from: usize, connection: u64) -> bool {
        self.replica.is_some_and(|replica| replica.from == from && replica.connection == connection)
    }

    fn incoming_of(&mut self, from: usize, connection: u64) -> Option<&mut Incoming<T>> {
        self.incoming.as_mut().filter(|incoming| incoming.from == from && incoming.connection == connection)
    }

    /// The table would hold more than `--max-keys` grants: the snapshot and
    /// the stream are dropped (a peer cannot make this node hold more than
    /// its shards could).
    fn overflow(&mut self, what: &'static str) -> Received<T::Refused> {
        self.clear();
        Received::Broken(Break::Overflow { what })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ringlock_shards::token::{token, token_epoch};

    use super::*;

    const KEYS_MAX: usize = 100;

    /// A table of the last token of each key, refusing a token not above it.
    #[derive(Debug, Default)]
    struct Table(BTreeMap<&'static str, u64>);

    impl ReplicaTable for Table {
        type Entry = (&'static str, u64);
        type Delta = (&'static str, u64);
        type Refused = (&'static str, u64);

        fn empty() -> Table {
            Table::default()
        }

        fn insert(&mut self, _now_ms: u64, (key, token): (&'static str, u64)) {
            self.0.insert(key, token);
        }

        fn apply(&mut self, _now_ms: u64, (key, token): (&'static str, u64)) -> Result<(), (&'static str, u64)> {
            if self.0.get(key).is_some_and(|&last| token <= last) {
                return Err((key, token));
            }
            self.0.insert(key, token);
            Ok(())
        }

        fn len(&self) -> usize {
            self.0.len()
        }

        fn token_epoch_max(&self) -> u64 {
            self.0.values().map(|&token| token_epoch(token)).max().unwrap_or(0)
        }
    }

    fn table(stream: u64, version: u64) -> TableVersion {
        TableVersion { stream, version }
    }

    fn grant(name: &'static str, sequence: u64) -> (&'static str, u64) {
        (name, token(32, sequence))
    }

    fn entry(name: &'static str, sequence: u64) -> (&'static str, u64) {
        (name, token(32, sequence))
    }

    /// A receiver that applied a snapshot of one grant from peer 1 on
    /// connection 7, at version 5 of stream 32.
    fn following() -> (StreamReceiver<Table>, Table) {
        let mut receiver = StreamReceiver::<Table>::default();
        let mut mirror = Table::default();
        assert_eq!(receiver.snapshot_begin(1, 7, table(32, 5), false), Received::SnapshotBegun);
        assert_eq!(receiver.snapshot_chunk(0, 1, 7, vec![entry("a", 1)], KEYS_MAX), Received::SnapshotProgress);
        let applied = receiver.snapshot_end(1, 7, table(32, 5), false, &mut mirror);
        assert_eq!(applied, Received::SnapshotApplied { table: table(32, 5), grants: 1, token_epoch_max: 32 });
        (receiver, mirror)
    }

    #[test]
    fn a_snapshot_in_slices_with_deltas_between_them_becomes_the_table() {
        let mut receiver = StreamReceiver::<Table>::default();
        let mut mirror = Table::default();
        receiver.snapshot_begin(1, 7, table(32, 5), false);
        receiver.snapshot_chunk(0, 1, 7, vec![entry("a", 1)], KEYS_MAX);
        let between = receiver.deltas(0, 1, 7, 32, 6, vec![grant("b", 2), grant("c", 3)], KEYS_MAX, &mut mirror);
        assert_eq!(between, Received::SnapshotProgress);
        assert_eq!(mirror.len(), 0, "deltas between slices go into the snapshot, not the table");
        receiver.snapshot_chunk(0, 1, 7, vec![entry("d", 4)], KEYS_MAX);
        let applied = receiver.snapshot_end(1, 7, table(32, 7), false, &mut mirror);
        assert_eq!(applied, Received::SnapshotApplied { table: table(32, 7), grants: 4, token_epoch_max: 32 });
        assert_eq!(receiver.replica_table(), Some(table(32, 7)));
        let after = receiver.deltas(0, 1, 7, 32, 8, vec![grant("e", 5)], KEYS_MAX, &mut mirror);
        assert_eq!(after, Received::Applied { table: table(32, 8), token_epoch_max: 32 });
        assert_eq!(mirror.len(), 5);
    }

    #[test]
    fn a_snapshot_end_that_does_not_match_its_begin_is_dropped() {
        let mut mirror = Table::default();
        for (from, connection, end) in [(2, 7, table(32, 5)), (1, 8, table(32, 5)), (1, 7, table(32, 6))] {
            let mut receiver = StreamReceiver::<Table>::default();
            receiver.snapshot_begin(1, 7, table(32, 5), false);
            assert_eq!(receiver.snapshot_end(from, connection, end, false, &mut mirror), Received::Ignored);
            assert_eq!(receiver.replica_table(), None);
            // The snapshot under way is gone: its chunks are not taken any more.
            assert_eq!(receiver.snapshot_chunk(0, 1, 7, vec![entry("a", 1)], KEYS_MAX), Received::Ignored);
        }
    }

    #[test]
    fn a_serving_node_takes_no_snapshot() {
        let mut receiver = StreamReceiver::<Table>::default();
        let mut mirror = Table::default();
        assert_eq!(receiver.snapshot_begin(1, 7, table(32, 5), true), Received::Ignored);
        receiver.snapshot_begin(1, 7, table(32, 5), false);
        assert_eq!(receiver.snapshot_end(1, 7, table(32, 5), true, &mut mirror), Received::Ignored);
        assert_eq!(receiver.replica_table(), None);
    }

    #[test]
    fn deltas_out_of_order_within_a_snapshot_break_it() {
        let mut mirror = Table::default();
        // A version gap, and another stream.
        for (stream, first_version) in [(32, 7), (48, 6)] {
            let mut receiver = StreamReceiver::<Table>::default();
            receiver.snapshot_begin(1, 7, table(32, 5), false);
            let broken = receiver.deltas(0, 1, 7, stream, first_version, vec![grant("b", 2)], KEYS_MAX, &mut mirror);
            assert_eq!(broken, Received::Broken(Break::SnapshotOutOfOrder { stream, first_version }));
            assert_eq!(receiver.snapshot_end(1, 7, table(32, 6), false, &mut mirror), Received::Ignored);
        }
        // A grant the table refuses.
        let mut receiver = StreamReceiver::<Table>::default();
        receiver.snapshot_begin(1, 7, table(32, 5), false);
        receiver.snapshot_chunk(0, 1, 7, vec![entry("a", 4)], KEYS_MAX);
        let broken = receiver.deltas(0, 1, 7, 32, 6, vec![grant("a", 3)], KEYS_MAX, &mut mirror);
        assert_eq!(broken, Received::Broken(Break::SnapshotOutOfOrder { stream: 32, first_version: 6 }));
    }

    #[test]
    fn a_version_gap_or_another_stream_breaks_the_stream() {
        for (stream, first_version) in [(32, 7), (32, 5), (48, 6)] {
            let (mut receiver, mut mirror) = following();
            let broken = receiver.deltas(0, 1, 7, stream, first_version, vec![grant("b", 2)], KEYS_MAX, &mut mirror);
            assert_eq!(broken, Received::Broken(Break::Gap { stream, first_version }));
            assert_eq!(receiver.replica_table(), None);
            assert_eq!(mirror.len(), 1, "nothing of a broken stream is applied");
            let after = receiver.deltas(0, 1, 7, 32, 6, vec![grant("b", 2)], KEYS_MAX, &mut mirror);
            assert_eq!(after, Received::Ignored, "nothing more is taken until a new snapshot");
        }
    }

    #[test]
    fn a_refused_delta_breaks_the_stream() {
        let (mut receiver, mut mirror) = following();
        let broken = receiver.deltas(0, 1, 7, 32, 6, vec![grant("a", 1)], KEYS_MAX, &mut mirror);
        assert_eq!(broken, Received::Broken(Break::OutOfOrder(("a", token(32, 1)))));
        assert_eq!(receiver.replica_table(), None);
    }

    #[test]
    fn frames_of_another_peer_or_connection_are_ignored() {
        let (mut receiver, mut mirror) = following();
        for (from, connection) in [(2, 7), (1, 8)] {
            let other = receiver.deltas(0, from, connection, 32, 6, vec![grant("b", 2)], KEYS_MAX, &mut mirror);
            assert_eq!(other, Received::Ignored);
            assert!(!receiver.connection_closed(from, connection));
        }
        assert_eq!(receiver.replica_table(), Some(table(32, 5)));
        assert!(receiver.connection_closed(1, 7), "the stream's own connection closing breaks it");
        assert_eq!(receiver.replica_table(), None);
    }

    #[test]
    fn a_new_snapshot_on_the_stream_connection_replaces_the_stream() {
        let (mut receiver, mut mirror) = following();
        receiver.snapshot_begin(1, 7, table(32, 9), false);
        assert_eq!(receiver.replica_table(), None);
        let between = receiver.deltas(0, 1, 7, 32, 10, vec![grant("b", 2)], KEYS_MAX, &mut mirror);
        assert_eq!(between, Received::SnapshotProgress);
        assert_eq!(mirror.len(), 1, "the old table stays until the new snapshot ends");
    }

    #[test]
    fn more_grants_than_keys_max_drop_the_snapshot_and_the_stream() {
        let mut receiver = StreamReceiver::<Table>::default();
        receiver.snapshot_begin(1, 7, table(32, 5), false);
        let entries = vec![entry("a", 1), entry("b", 2), entry("c", 3)];
        let broken = receiver.snapshot_chunk(0, 1, 7, entries, 2);
        assert_eq!(broken, Received::Broken(Break::Overflow { what: "snapshot" }));
        let (mut receiver, mut mirror) = following();
        let broken = receiver.deltas(0, 1, 7, 32, 6, vec![grant("b", 2)], 1, &mut mirror);
        assert_eq!(broken, Received::Broken(Break::Overflow { what: "replication stream" }));
        assert_eq!(receiver.replica_table(), None);
    }
}
