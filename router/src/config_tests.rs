//! Flag parsing: defaults, ranges, and the engine flags passed to spawned workers.

use super::*;

fn parse(args: &[&str]) -> Result<Config, clap::Error> {
    Config::try_parse_from(std::iter::once("minisgl-router").chain(args.iter().copied()))
}

#[test]
fn defaults() {
    let c = parse(&[]).unwrap();
    assert_eq!(
        (c.host.as_str(), c.port, c.local_workers()),
        ("127.0.0.1", 8000, 1)
    );
    assert_eq!(
        (c.device, c.dtype, c.ready_timeout),
        (Device::Auto, Dtype::Auto, 600)
    );
    assert!(c.model.is_none() && c.check().is_ok());
    assert_eq!(c.max_requests.get(), 4096);
}

#[test]
fn routing_policies_by_name() {
    assert_eq!(
        parse(&[]).unwrap().routing_policy,
        RoutingPolicy::CacheAware
    );
    for (name, policy) in [
        ("cache_aware", RoutingPolicy::CacheAware),
        ("round_robin", RoutingPolicy::RoundRobin),
        ("least_load", RoutingPolicy::LeastLoad),
        ("power_of_two", RoutingPolicy::PowerOfTwo),
    ] {
        let c = parse(&["--routing-policy", name]).unwrap();
        assert_eq!(c.routing_policy, policy);
    }
    let err = parse(&["--routing-policy", "random"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("possible values: cache_aware, round_robin"),
        "{err}"
    );
}

#[test]
fn cache_aware_thresholds_default_and_bounds() {
    use crate::routing::policy::Thresholds;
    assert_eq!(parse(&[]).unwrap().cache_aware, Thresholds::default());
    let c = parse(&[
        "--cache-threshold",
        "0.3",
        "--balance-abs-threshold",
        "64",
        "--balance-rel-threshold",
        "1.1",
    ])
    .unwrap();
    let t = Thresholds {
        cache_threshold: 0.3,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.1,
    };
    assert_eq!(c.cache_aware, t);
    for (flag, value, says) in [
        ("--cache-threshold", "1.5", "between 0 and 1"),
        ("--balance-rel-threshold", "0.5", "at least 1"),
        ("--balance-abs-threshold", "x", "--balance-abs-threshold"),
    ] {
        let err = parse(&[flag, value]).unwrap_err().to_string();
        assert!(err.contains(says) && err.contains(flag), "{err}");
    }
}

#[test]
fn max_requests_must_be_positive() {
    assert_eq!(
        parse(&["--max-requests", "2"]).unwrap().max_requests.get(),
        2
    );
    let err = parse(&["--max-requests", "0"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--max-requests"), "{err}");
}

#[test]
fn remote_workers_replace_local_ones_unless_asked() {
    let c = parse(&["--worker", "tcp://a:1", "--worker", "tcp://b:2"]).unwrap();
    assert_eq!((c.local_workers(), c.remote_workers.len()), (0, 2));
    let c = parse(&["--worker", "tcp://a:1", "--workers", "2"]).unwrap();
    assert_eq!(c.local_workers(), 2);
    assert!(parse(&["--workers", "0"]).unwrap().check().is_err());
    assert!(parse(&["--worker", "a:1"])
        .unwrap()
        .check()
        .unwrap_err()
        .contains("got a:1"));
}

#[test]
fn tp_is_positive_and_for_spawned_workers() {
    assert_eq!(parse(&[]).unwrap().tp, 1);
    let c = parse(&["--tp", "3", "--workers", "2"]).unwrap();
    assert_eq!((c.tp, c.local_workers()), (3, 2));
    assert!(c.check().is_ok());
    let err = parse(&["--tp", "0"]).unwrap_err();
    assert!(err.to_string().contains("--tp"), "{err}");
    let err = parse(&["--tp", "2", "--worker", "tcp://a:1"])
        .unwrap()
        .check()
        .unwrap_err();
    assert!(
        err.contains("--tp 2 applies to the workers this router spawns"),
        "{err}"
    );
}

#[test]
fn enums_and_errors() {
    let c = parse(&[
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
        "--page-size",
        "16",
        "--cache",
        "naive",
        "--chunk-size",
        "512",
        "--mixed-chunk-size",
        "128",
        "--mixed-step-tokens",
        "256",
        "--schedule-policy",
        "lof",
    ])
    .unwrap();
    assert_eq!(
        (c.device.as_str(), c.dtype.as_str(), c.page_size),
        ("cuda", "bfloat16", Some(16))
    );
    assert_eq!((c.cache, c.chunk_size), (Some(Cache::Naive), Some(512)));
    assert_eq!(
        (c.mixed_chunk_size, c.mixed_step_tokens, c.schedule_policy),
        (Some(128), Some(256), Some(Policy::Lof))
    );
    let spf = parse(&["--schedule-policy", "spf"])
        .unwrap()
        .schedule_policy;
    assert_eq!(spf.map(Policy::as_str), Some("spf"));
    let err = parse(&["--device", "tpu"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    for bad in [
        ["--cache", "lru"],
        ["--chunk-size", "0"],
        ["--mixed-chunk-size", "0"],
        ["--mixed-step-tokens", "3"],
        ["--schedule-policy", "lifo"],
    ] {
        assert_eq!(parse(&bad).unwrap_err().exit_code(), 2);
    }
    assert_eq!(parse(&["--help"]).unwrap_err().exit_code(), 0);
}

#[test]
fn engine_flags_for_the_spawned_workers() {
    let c = parse(&[
        "--kv-tokens",
        "100000",
        "--cuda-graph-max-bs",
        "0",
        "--cuda-graph-max-tokens",
        "256",
        "--attention-backend",
        "torch",
        "--gemm",
        "cublas",
        "--kv-cache-dtype",
        "fp8_e4m3",
    ])
    .unwrap();
    assert_eq!(
        (c.kv_tokens, c.cuda_graph_max_bs, c.cuda_graph_max_tokens),
        (Some(100000), Some(0), Some(256))
    );
    assert_eq!(c.attention_backend, Some(AttentionBackend::Torch));
    assert_eq!(c.gemm, Some(Gemm::Cublas));
    assert_eq!(c.kv_cache_dtype, Some(KvCacheDtype::Fp8E4m3));
    let c = parse(&[]).unwrap();
    assert_eq!(c.gemm, None);
    assert_eq!((c.kv_tokens, c.cuda_graph_max_tokens), (None, None));
    assert_eq!(
        parse(&["--cuda-graph-max-tokens", "0"])
            .unwrap()
            .cuda_graph_max_tokens,
        Some(0)
    );
    let err = parse(&["--cuda-graph-max-tokens", "8"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let text = err.to_string();
    assert!(text.contains("--cuda-graph-max-tokens"), "{text}");
    assert!(
        text.contains("must be 0 (no piecewise graphs) or >= 16; got 8"),
        "{text}"
    );
    for bad in [
        ["--kv-tokens", "0"],
        ["--cuda-graph-max-bs", "-1"],
        ["--attention-backend", "fa3"],
    ] {
        assert_eq!(parse(&bad).unwrap_err().exit_code(), 2, "{bad:?}");
    }
}

#[test]
fn api_key_and_the_exposure_warning() {
    let c = parse(&["--host", "0.0.0.0"]).unwrap();
    let warning = c.exposure_warning().unwrap();
    assert!(warning.starts_with("--host 0.0.0.0 is reachable from other machines"));
    let c = parse(&["--host", "0.0.0.0", "--api-key", "k"]).unwrap();
    assert_eq!(
        (c.api_key.as_deref(), c.exposure_warning()),
        (Some("k"), None)
    );
    assert_eq!(
        parse(&["--host", "localhost"]).unwrap().exposure_warning(),
        None
    );
    let empty = parse(&["--api-key", ""]).unwrap();
    assert_eq!(
        empty.check().unwrap_err(),
        "--api-key (or MINISGL_API_KEY) must not be empty"
    );
}

#[test]
fn help_lists_the_flags_under_their_headings() {
    let help = parse(&["--help"]).unwrap_err().render().to_string();
    let at = |s: &str| {
        help.find(s)
            .unwrap_or_else(|| panic!("{s} not in --help:\n{help}"))
    };
    let headings = [
        "Model:",
        "Server:",
        "Workers and routing:",
        "Spawned workers' engine",
        "Request limits:",
        "Chat: tool calls and reasoning:",
        "Terminal chat:",
    ];
    let starts: Vec<usize> = headings.iter().map(|h| at(h)).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{help}");
    let under = |flag: &str, heading: usize| {
        let i = at(flag);
        assert!(
            starts[heading] < i && starts.get(heading + 1).into_iter().all(|&n| i < n),
            "{flag}"
        );
    };
    under("--dtype <DTYPE>", 0);
    under("--api-key <KEY>", 1);
    under("--cache-threshold <SHARE>", 2);
    under("--kv-cache-dtype <KV_CACHE_DTYPE>", 3);
    under("--max-tokens-limit <N>", 4);
    under("--reasoning-parser <NAME>", 5);
    under("--url <http://HOST:PORT>", 6);
}
