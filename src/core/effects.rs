//! The shard's effects on its core: replies go to their connections (see
//! `dispatch`), and a shard short of tokens gets a range from the authority.

use crate::core::event_loop::EventLoop;
use crate::node::role::CoreRole;

/// Pause before asking again for tokens after the epoch could not be persisted.
pub(crate) const TOKEN_RETRY_MS: u64 = 1000;

impl EventLoop {
    /// Routes the shard's effects: replies to connections here or to their
    /// core, token requests to the authority.
    pub(crate) fn handle_shard_effects(&mut self) {
        loop {
            self.state.deliver_replies(&mut self.shard);
            // Tokens come only while active: a shortage found meanwhile
            // waits for the role to come back.
            if !self.state.need_tokens || self.state.role != CoreRole::Active {
                return;
            }
            self.state.need_tokens = false;
            match self.state.shared.authority.take_range() {
                Ok(range) => {
                    if let Err(error) = self.shard.add_token_range(self.state.now_ms, range) {
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
            self.shard.token_request_lost();
        }
    }
}
