//! `minisgl_routing_decisions_total{worker, reason}`: how many requests each rule of the
//! routing policy sent to each worker, so that a run shows how often cache affinity
//! (`prefix`) gave way to load (`balance`) or a new prefix was spread (`spread`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use super::policy::{Pick, Reason};
use crate::worker::WorkerClient;

#[derive(Default)]
pub struct Decisions {
    /// (worker index, reason) -> picks.
    counts: Mutex<BTreeMap<(usize, Reason), u64>>,
}

impl Decisions {
    pub fn record(&self, pick: Pick) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry((pick.index, pick.reason))
            .or_default() += 1;
    }

    pub fn count(&self, index: usize, reason: Reason) -> u64 {
        let counts = self.counts.lock().unwrap();
        counts.get(&(index, reason)).copied().unwrap_or(0)
    }

    /// Every (worker, reason) series, zeros included, so that rates are defined from the start.
    pub fn render(&self, out: &mut String, workers: &[WorkerClient]) {
        let name = "minisgl_routing_decisions_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests the routing policy sent to each worker, by the rule that \
             chose it (prefix, spread, balance; policy for the one-rule policies).\n\
             # TYPE {name} counter"
        );
        for (index, w) in workers.iter().enumerate() {
            for reason in Reason::ALL {
                let n = self.count(index, reason);
                let (address, reason) = (w.address(), reason.as_str());
                let _ = writeln!(
                    out,
                    "{name}{{worker=\"{address}\",reason=\"{reason}\"}} {n}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_are_counted_by_worker_and_reason() {
        let d = Decisions::default();
        let pick = |index, reason| Pick { index, reason };
        d.record(pick(1, Reason::Prefix));
        d.record(pick(1, Reason::Prefix));
        d.record(pick(0, Reason::Balance));
        assert_eq!(d.count(1, Reason::Prefix), 2);
        assert_eq!(d.count(0, Reason::Balance), 1);
        assert_eq!(d.count(0, Reason::Prefix), 0);
    }
}
