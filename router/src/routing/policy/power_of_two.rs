//! Power of two choices (Mitzenmacher): sample two distinct ready workers at random and
//! send the request to the one with fewer requests in flight (ties: the first sampled).
//! Nearly as even as least load, without every request herding onto the same idlest
//! worker when load figures lag; SGLang's gateway offers it for the same reason (there on
//! load polled every 5 s; here on the router's own in-flight count). One ready worker: it.

use rand::RngExt;

use super::{by_policy, ready_loads, Pick, Policy};
use crate::worker::WorkerClient;

pub struct PowerOfTwo;

/// `loads`: (index, in flight) of the ready workers; `draw(n)` a uniform index below n.
fn pick_among(loads: &[(usize, usize)], mut draw: impl FnMut(usize) -> usize) -> Option<usize> {
    match loads.len() {
        0 => None,
        1 => Some(loads[0].0),
        n => {
            let a = draw(n);
            let mut b = draw(n - 1);
            if b >= a {
                b += 1; // two distinct workers
            }
            let pick = if loads[b].1 < loads[a].1 { b } else { a };
            Some(loads[pick].0)
        }
    }
}

impl Policy for PowerOfTwo {
    fn pick(&self, workers: &[WorkerClient], _input_ids: &[u32]) -> Option<Pick> {
        let mut rng = rand::rng();
        by_policy(pick_among(&ready_loads(workers), |n| {
            rng.random_range(0..n)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_less_loaded_of_two_distinct_samples_wins() {
        let loads = [(0, 9), (1, 2), (4, 7)];
        // Draws 0 then 0: the second sample skips the first, so workers 0 and 1 compete.
        assert_eq!(pick_among(&loads, |_| 0), Some(1));
        // Draws 2 then 1: workers 4 and 1.
        let mut draws = [2, 1].into_iter();
        assert_eq!(pick_among(&loads, |_| draws.next().unwrap()), Some(1));
        assert_eq!(pick_among(&[(3, 100)], |_| unreachable!()), Some(3));
        assert_eq!(pick_among(&[], |_| 0), None);
    }

    #[test]
    fn random_draws_stay_in_range_and_reach_every_pair() {
        let mut rng = rand::rng();
        let loads = [(0, 0), (1, 0), (2, 0)];
        let mut seen = [false; 3];
        for _ in 0..200 {
            let i = pick_among(&loads, |n| rng.random_range(0..n)).unwrap();
            seen[i] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
