//! What the shell does for the dispatcher beyond sockets: the replication
//! core's orders to the core ([`Control`]: serve, hold, resume, follow), the
//! fencing-token ranges the shard calls for, and the deltas it reports.
//! Each involves the node's shared state (the token authority persists its
//! epoch; reports go to the replication core), so it stays out of the pure
//! dispatcher, which only changes role and takes the ranges.

use crate::node::role::{ClusterLink, Control, Report};
use crate::shard_core::event_loop::EventLoop;

/// Pause before asking again for tokens after the epoch could not be persisted.
pub(crate) const TOKEN_RETRY_MS: u64 = 1000;

impl EventLoop {
    /// An order from the replication core.
    pub(super) fn control(&mut self, control: Control) {
        match control {
            Control::Activate { restore } => {
                self.dispatcher.activate(restore);
                // Whatever tokens the core still holds may be of an older
                // epoch: a range of the current one replaces them before the
                // held requests are served.
                self.supply_tokens();
                self.dispatcher.serve_held();
            }
            Control::Follow { active } => self.dispatcher.follow(active),
            Control::Hold => {
                self.dispatcher.hold();
                // Every delta so far goes before the report that says so.
                self.supply_tokens();
                self.queue_deltas();
                self.state.reports.push_back(Report::Held { core: self.state.core });
            }
            Control::Resume => self.dispatcher.serve_held(),
            Control::Acknowledged { reports } => self.dispatcher.acknowledged(reports),
            Control::Granting(granting) => self.dispatcher.set_granting(granting),
        }
        self.supply_tokens();
    }

    /// Gives the shard the token ranges it calls for, while it is active.
    pub(crate) fn supply_tokens(&mut self) {
        while self.dispatcher.take_token_call() {
            match self.state.shared.authority.take_range() {
                Ok(range) => {
                    if let Err(error) = self.dispatcher.add_token_range(range) {
                        tracing::error!(core = self.state.core, ?error, "token range refused");
                        self.state.token_retry_at_ms = Some(self.state.now_ms + TOKEN_RETRY_MS);
                    }
                }
                Err(error) => {
                    // Without a persisted epoch no token may be issued: acquires
                    // wait, the operator is told why, and the core asks again.
                    tracing::error!(core = self.state.core, "cannot get tokens: {error}");
                    self.state.token_retry_at_ms = Some(self.state.now_ms + TOKEN_RETRY_MS);
                    return;
                }
            }
        }
    }

    /// After the epoch could not be persisted, asks for tokens again now and then.
    pub(crate) fn retry_tokens(&mut self) {
        if let Some(at) = self.state.token_retry_at_ms
            && self.state.now_ms >= at
        {
            self.state.token_retry_at_ms = None;
            self.dispatcher.token_request_lost();
        }
    }

    /// Queues the deltas the shard made so far as one report, after the
    /// earlier ones.
    pub(crate) fn queue_deltas(&mut self) {
        let link = self.state.shared.cluster.as_ref();
        if let Some(deltas) = self.dispatcher.take_deltas(|| link.map(ClusterLink::delta_buffer).unwrap_or_default()) {
            self.dispatcher.deltas_reported();
            self.state.reports.push_back(Report::Deltas { core: self.state.core, deltas });
        }
    }
}
