//! Which GPUs each spawned worker sees (its `CUDA_VISIBLE_DEVICES`). With `--tp N` worker i
//! holds the i-th group of N visible GPUs (its rank r takes the group's r-th), so
//! `--workers 2 --tp 2` uses four, and fewer than workers x tp is an error that names the
//! flags: two ranks of one group cannot share a GPU. With `--tp 1` and several workers,
//! worker i gets GPU i, wrapping around (several workers may share a GPU on purpose). On
//! CPU, or with no GPU found under `--device auto`, nothing is set.

use std::path::Path;

/// `CUDA_VISIBLE_DEVICES` for each of `count` workers (None: leave it as it is).
/// `visible`: the router's own `CUDA_VISIBLE_DEVICES`; `found`: GPUs on the host.
pub fn assign(
    device: &str,
    count: usize,
    tp: usize,
    visible: Option<&str>,
    found: usize,
) -> Result<Vec<Option<String>>, String> {
    let none = vec![None; count];
    if device == "cpu" {
        return Ok(none);
    }
    let gpus: Vec<String> = match visible.filter(|v| !v.trim().is_empty()) {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => (0..found).map(|i| i.to_string()).collect(),
    };
    let need = count * tp;
    if tp > 1 && gpus.len() < need && !(gpus.is_empty() && device == "auto") {
        return Err(format!(
            "--workers {count} x --tp {tp} needs {need} GPUs; {} visible{}",
            gpus.len(),
            visible.map_or(String::new(), |v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
        ));
    }
    if gpus.is_empty() || (tp == 1 && count < 2) {
        return Ok(none);
    }
    Ok((0..count)
        .map(|i| {
            let group: Vec<&str> = (0..tp)
                .map(|r| gpus[(i * tp + r) % gpus.len()].as_str())
                .collect();
            Some(group.join(","))
        })
        .collect())
}

/// GPUs on this host: the NVIDIA device files `/dev/nvidia0`, `/dev/nvidia1`, ...
pub fn found() -> usize {
    (0..)
        .take_while(|i| Path::new(&format!("/dev/nvidia{i}")).exists())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn each_worker_gets_its_own_group_of_tp_gpus() {
        assert_eq!(
            assign("cuda", 2, 2, None, 4).unwrap(),
            some(&["0,1", "2,3"])
        );
        assert_eq!(
            assign("auto", 2, 2, Some("4,5,6,7"), 8).unwrap(),
            some(&["4,5", "6,7"])
        );
        assert_eq!(assign("cuda", 1, 3, None, 8).unwrap(), some(&["0,1,2"]));
    }

    #[test]
    fn too_few_gpus_for_workers_times_tp_is_an_error_naming_the_flags() {
        let err = assign("cuda", 2, 2, Some("0,1,2"), 8).unwrap_err();
        assert_eq!(
            err,
            "--workers 2 x --tp 2 needs 4 GPUs; 3 visible (CUDA_VISIBLE_DEVICES=0,1,2)"
        );
        let err = assign("auto", 1, 2, None, 1).unwrap_err();
        assert_eq!(err, "--workers 1 x --tp 2 needs 2 GPUs; 1 visible");
        assert!(assign("cuda", 1, 2, None, 0).is_err());
    }

    #[test]
    fn cpu_and_gpu_less_auto_set_nothing() {
        assert_eq!(assign("cpu", 2, 3, Some("0,1"), 2).unwrap(), vec![None; 2]);
        assert_eq!(assign("auto", 1, 3, None, 0).unwrap(), vec![None]);
    }

    #[test]
    fn tp1_workers_spread_over_gpus_and_may_share_them() {
        assert_eq!(assign("cuda", 1, 1, None, 2).unwrap(), vec![None]);
        assert_eq!(
            assign("cuda", 3, 1, Some("0,1"), 2).unwrap(),
            some(&["0", "1", "0"])
        );
    }
}
