//! The Prometheus text format (0.0.4) of what `prometheus-client` writes as OpenMetrics, for scrapers
//! that do not ask for OpenMetrics. The two differ where a text-format parser would misread the
//! OpenMetrics text: a counter's family is named with its `_total` suffix, an `info` family is a gauge
//! named with its `_info` suffix, and there is no `# UNIT` line and no `# EOF`. Samples are the same.
use std::collections::HashMap;

/// `openmetrics` (one exposition as `prometheus_client::encoding::text::encode` writes it) as text 0.0.4.
pub fn prometheus_text(openmetrics: &str) -> String {
    // A family's kind, from its `# TYPE` line, which may come after its `# HELP`.
    let kinds: HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect();
    let renamed = |name: &str| -> String {
        match kinds.get(name) {
            Some(&"counter") if !name.ends_with("_total") => format!("{name}_total"),
            Some(&"info") if !name.ends_with("_info") => format!("{name}_info"),
            _ => name.to_string(),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", renamed(name)));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let kind = match kind {
                "info" | "stateset" => "gauge",
                "unknown" | "gaugehistogram" => "untyped",
                other => other,
            };
            out.push_str(&format!("# TYPE {} {kind}\n", renamed(name)));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_infos_are_named_as_their_samples_and_the_openmetrics_markers_go() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{r=\"x\"} 3\n\
                  # HELP a_build Build.\n# TYPE a_build info\na_build_info{version=\"1\"} 1\n\
                  # HELP a_up Up.\n# TYPE a_up gauge\n# UNIT a_up seconds\na_up 1\n# EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{r=\"x\"} 3\n\
             # HELP a_build_info Build.\n# TYPE a_build_info gauge\na_build_info{version=\"1\"} 1\n\
             # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n"
        );
    }
}
