//! What a replica's `/status` says (the fields the demo and the tests look at), and when a set of
//! replicas agrees on a leader.

use std::net::SocketAddr;

use serde::Deserialize;

use crate::http;

/// What `/status` says (the fields callers look at).
#[derive(Debug, Clone, Deserialize)]
pub struct StatusView {
    pub id: u64,
    pub leader_id: Option<u64>,
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied: u64,
    /// The last index the latest snapshot covers.
    #[serde(default)]
    pub snapshot_index: u64,
    /// The last index purged from the log (everything up to it is only in the snapshot).
    #[serde(default)]
    pub purged_index: u64,
}

/// The `/status` of the replica whose HTTP endpoint is `addr`, if it answers.
pub fn status(addr: SocketAddr) -> Option<StatusView> {
    let (code, body) = http::get(addr, "/status").ok()?;
    if code != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

/// The leader that every replica of `statuses` names, if they all name the same one and it reports
/// itself leader. A replica that did not answer (`None`) names no one.
pub fn agreed_leader(statuses: &[(u64, Option<StatusView>)]) -> Option<u64> {
    let first = statuses.first()?.1.as_ref()?.leader_id?;
    let all_agree = statuses
        .iter()
        .all(|(_, s)| s.as_ref().and_then(|s| s.leader_id) == Some(first));
    let leader_says_so = statuses
        .iter()
        .any(|(id, s)| *id == first && s.as_ref().is_some_and(|s| s.state == "Leader"));
    (all_agree && leader_says_so).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, leader_id: Option<u64>, state: &str) -> Option<StatusView> {
        Some(StatusView {
            id,
            leader_id,
            state: state.into(),
            term: 1,
            last_log_index: 0,
            last_applied: 0,
            snapshot_index: 0,
            purged_index: 0,
        })
    }

    #[test]
    fn a_leader_counts_once_everyone_names_it_and_it_leads() {
        let agreed = [
            (1, view(1, Some(2), "Follower")),
            (2, view(2, Some(2), "Leader")),
        ];
        assert_eq!(agreed_leader(&agreed), Some(2));
        let not_yet_leading = [
            (1, view(1, Some(2), "Follower")),
            (2, view(2, Some(2), "Candidate")),
        ];
        assert_eq!(agreed_leader(&not_yet_leading), None);
        let silent = [(1, view(1, Some(1), "Leader")), (2, None)];
        assert_eq!(agreed_leader(&silent), None);
        assert_eq!(agreed_leader(&[]), None);
    }
}
