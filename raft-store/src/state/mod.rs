//! The replicated state and its deterministic `apply`.
//!
//! [`CoordState::apply`] is a pure function of (state, proposal): no clock, no randomness, no I/O.
//! It also reports the [`Change`]s it made so the server can wake parked calls and feed watches
//! without polling the state.

mod kv;
mod sessions;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use kv::{KvEntry, KvStore};
pub use sessions::{SessionTable, SESSION_IDLE_TTL_MS};

use crate::command::{Command, CommandResult, Op, Proposal};

/// Everything the ensemble agrees on. A snapshot is exactly this value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordState {
    pub kv: KvStore,
    pub sessions: SessionTable,
}

/// One effect of applying a command, reported to the server after the state changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    KvPut {
        key: String,
        value: Bytes,
        revision: u64,
    },
    KvDelete {
        key: String,
        revision: u64,
    },
}

impl CoordState {
    /// Applies every command of `proposal` in order and returns one result per command.
    pub fn apply(&mut self, proposal: &Proposal, changes: &mut Vec<Change>) -> Vec<CommandResult> {
        let now = proposal.proposed_at_ms;
        self.sessions.expire(now);
        proposal
            .commands
            .iter()
            .map(|cmd| self.apply_command(cmd, now, changes))
            .collect()
    }

    fn apply_command(
        &mut self,
        cmd: &Command,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if let Some(req) = &cmd.request {
            if let Some(previous) = self.sessions.replay(req, now_ms) {
                return previous;
            }
        }
        let result = match &cmd.op {
            Op::KvPut {
                key,
                value,
                overwrite,
            } => self.kv.put(key, value, *overwrite, changes),
            Op::KvDelete { key } => self.kv.delete(key, changes),
            Op::KvIncrement { key, delta } => self.kv.increment(key, *delta, changes),
        };
        if let Some(req) = &cmd.request {
            self.sessions.record(req, &result);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{OpError, Output, RequestId};

    fn cmd(client: u64, seq: u64, op: Op) -> Command {
        Command {
            request: Some(RequestId {
                client,
                seq,
                acked_below: 1,
            }),
            op,
        }
    }

    fn incr(key: &str) -> Op {
        Op::KvIncrement {
            key: key.into(),
            delta: 1,
        }
    }

    #[test]
    fn a_retried_command_is_applied_once() {
        let mut s = CoordState::default();
        let mut ch = Vec::new();
        let first = s.apply(&Proposal::new(1, vec![cmd(9, 1, incr("n"))]), &mut ch);
        // The same request again, in a later entry (a retry after a leader change).
        let again = s.apply(&Proposal::new(2, vec![cmd(9, 1, incr("n"))]), &mut ch);
        assert_eq!(first, again);
        assert_eq!(
            s.kv.get("n").map(|e| e.value.clone()),
            Some(Bytes::from("1"))
        );
        assert_eq!(ch.len(), 1, "the retry changed nothing");
    }

    #[test]
    fn apply_is_deterministic() {
        let proposals: Vec<Proposal> = (0..50u64)
            .map(|i| {
                let op = match i % 3 {
                    0 => Op::KvPut {
                        key: format!("d/{}", i % 7),
                        value: Bytes::from(vec![i as u8; 3]),
                        overwrite: i % 2 == 0,
                    },
                    1 => incr(&format!("c/{}", i % 4)),
                    _ => Op::KvDelete {
                        key: format!("d/{}", i % 5),
                    },
                };
                Proposal::new(i * 1000, vec![cmd(i % 3, i, op)])
            })
            .collect();
        let run = || {
            let mut s = CoordState::default();
            let mut ch = Vec::new();
            let results: Vec<_> = proposals.iter().map(|p| s.apply(p, &mut ch)).collect();
            (s, results, ch)
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn failed_commands_change_nothing() {
        let mut s = CoordState::default();
        let mut ch = Vec::new();
        s.apply(
            &Proposal::new(
                1,
                vec![cmd(
                    1,
                    1,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("v"),
                        overwrite: false,
                    },
                )],
            ),
            &mut ch,
        );
        let before = s.kv.clone();
        let out = s.apply(
            &Proposal::new(
                2,
                vec![cmd(
                    1,
                    2,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("w"),
                        overwrite: false,
                    },
                )],
            ),
            &mut ch,
        );
        assert_eq!(out, vec![Err(OpError::AlreadyExists { key: "k".into() })]);
        assert_eq!(s.kv, before);
        let out = s.apply(
            &Proposal::new(
                3,
                vec![cmd(
                    1,
                    3,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("w"),
                        overwrite: true,
                    },
                )],
            ),
            &mut ch,
        );
        assert_eq!(out, vec![Ok(Output::Done)]);
    }
}
