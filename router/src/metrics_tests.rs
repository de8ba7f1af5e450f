//! Tests of `metrics.rs`: the Prometheus text it renders.

use super::*;

#[test]
fn histograms_are_cumulative() {
    let h = Histogram::default();
    h.observe(Duration::from_micros(500));
    h.observe(Duration::from_millis(3));
    h.observe(Duration::from_secs(60));
    let mut out = String::new();
    h.render(&mut out, "x", "help");
    assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
    assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
    assert!(out.contains("x_bucket{le=\"30\"} 2\n"), "{out}");
    assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
    assert!(out.contains("x_sum 60.0035\nx_count 3\n"), "{out}");
}

#[test]
fn requests_are_counted_by_endpoint_and_status() {
    let m = Metrics::default();
    m.count_request("/v1/completions", 200);
    m.count_request("/v1/completions", 200);
    m.count_request("/v1/completions", 400);
    m.observe_generation(Duration::from_millis(10), Duration::from_millis(30), 3);
    let out = m.render(&[], &Admission::new(7, std::time::Duration::ZERO));
    assert!(out.contains("minisgl_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"));
    assert!(out.contains("minisgl_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n"));
    assert!(out.contains("minisgl_time_per_output_token_seconds_count 1\n"));
    assert!(out.contains("\nminisgl_requests_in_flight 0\n"), "{out}");
    assert!(
        out.contains("\nminisgl_requests_in_flight_limit 7\n"),
        "{out}"
    );
    assert!(out.contains("minisgl_time_per_output_token_seconds_sum 0.01\n"));
}

#[tokio::test]
async fn the_router_reports_its_tasks_and_memory() {
    let task = tokio::spawn(std::future::pending::<()>());
    let out = Metrics::default().render(&[], &Admission::new(1, Duration::ZERO));
    task.abort();
    let value = |name: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    };
    assert_eq!(value("minisgl_router_tasks "), 1.0, "{out}");
    assert!(value("process_resident_memory_bytes ") > 1e6, "{out}");
}
