//! The replication core's orders to a shard core ([`Control`]): serve
//! (restoring the replicated grants), hold requests during a hand-off, serve
//! the held ones, or follow another active.

use ringlock_proto::ErrorCode;
use ringlock_shards::shard_of;

use crate::core::dispatch::Keyed;
use crate::core::event_loop::EventLoop;
use crate::node::role::{Control, CoreRole, Report};

impl EventLoop {
    /// An order from the replication core.
    pub(super) fn control(&mut self, control: Control) {
        let now_ms = self.state.now_ms;
        match control {
            Control::Activate { restore } => {
                for (key, token, lease_ms) in restore {
                    debug_assert_eq!(shard_of(key.as_bytes(), self.state.cores), self.state.core);
                    if !self.shard.restore(now_ms, key.as_bytes(), token, lease_ms) {
                        tracing::warn!(core = self.state.core, "a replicated grant could not be restored (table full)");
                    }
                }
                self.state.role = CoreRole::Active;
                self.state.active_address = None;
                // Whatever tokens the core still holds may be of an older
                // epoch: a fresh range of the current one replaces them.
                self.state.need_tokens = true;
                self.handle_shard_effects();
                self.serve_held();
            }
            Control::Follow { active } => {
                self.state.role = CoreRole::Standby;
                self.state.active_address = active.map(String::into_bytes);
                for (client, request) in std::mem::take(&mut self.state.parked) {
                    self.state.run_keyed(&mut self.shard, client, Keyed::of(&request));
                }
                self.shard.step_down(now_ms);
            }
            Control::Hold => {
                if self.state.role == CoreRole::Active {
                    self.state.role = CoreRole::Held;
                }
                // Every delta so far goes before the report that says so.
                self.handle_shard_effects();
                self.state.queue_deltas(&mut self.shard);
                self.state.reports.push_back(Report::Held { core: self.state.core });
            }
            Control::Resume => self.serve_held(),
        }
        self.handle_shard_effects();
    }

    /// Answers every held request `E <op> <key> <code>`, behind the earlier
    /// requests of the same connection and key.
    pub(crate) fn refuse_parked(&mut self, code: ErrorCode) {
        let now_ms = self.state.now_ms;
        for (client, request) in std::mem::take(&mut self.state.parked) {
            let keyed = Keyed::of(&request);
            self.shard.reject(now_ms, client, keyed.op(), keyed.key(), code);
        }
        self.handle_shard_effects();
    }

    /// Serves again, starting with the requests held meanwhile, in order.
    fn serve_held(&mut self) {
        if self.state.role == CoreRole::Held {
            self.state.role = CoreRole::Active;
        }
        for (client, request) in std::mem::take(&mut self.state.parked) {
            self.state.run_keyed(&mut self.shard, client, Keyed::of(&request));
        }
        self.handle_shard_effects();
    }
}
