//! How long a phase of `coord-bench xla-scale` may take, and while what must hold.

use std::time::Duration;

/// No phase may take longer: a stuck barrier fails the size instead of hanging the run.
pub(super) const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// `phase`, failed if it takes longer than [`PHASE_LIMIT`] or once `stable` (polled twice a
/// second) fails.
pub(super) async fn within<T>(
    phase: &str,
    stable: &impl Fn() -> Result<(), String>,
    f: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    let watch = async {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Err(e) = stable() {
                return e;
            }
        }
    };
    tokio::select! {
        done = tokio::time::timeout(PHASE_LIMIT, f) => {
            done.map_err(|_| format!("{phase} did not finish within {PHASE_LIMIT:?}"))?
        }
        e = watch => Err(format!("{phase}: {e}")),
    }
}
