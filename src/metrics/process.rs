//! The standard `process_*` metrics, read from `/proc/self` at each scrape (Linux; elsewhere none).
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

#[derive(Debug)]
pub(super) struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Reading {
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    pub virtual_bytes: i64,
    pub threads: i64,
    pub start_time_seconds: f64,
    pub open_fds: i64,
    pub max_fds: i64,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(r.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu",
            "User and system CPU time spent",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?)?;
        let gauges: [(&str, &str, Option<Unit>, f64); 6] = [
            (
                "process_resident_memory",
                "Resident memory size",
                Some(Unit::Bytes),
                r.resident_bytes as f64,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size",
                Some(Unit::Bytes),
                r.virtual_bytes as f64,
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Some(Unit::Seconds),
                r.start_time_seconds,
            ),
            ("process_threads", "OS threads", None, r.threads as f64),
            ("process_open_fds", "Open file descriptors", None, r.open_fds as f64),
            (
                "process_max_fds",
                "Limit on open file descriptors",
                None,
                r.max_fds as f64,
            ),
        ];
        for (name, help, unit, value) in gauges {
            ConstGauge::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                unit.as_ref(),
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
pub(super) fn read() -> Option<Reading> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name is in parentheses and may hold spaces: fields are counted after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is fields[n - 3] here (state is field 3).
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    // SAFETY: sysconf and getrlimit read process-wide values and write only to the struct we pass.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as i64;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<u64>().ok()))?;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let max_fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur as i64
    } else {
        -1
    };
    Some(Reading {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        threads: field(20)? as i64,
        start_time_seconds: boot as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)? as i64,
        resident_bytes: field(24)? as i64 * page,
        open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count() as i64,
        max_fds,
    })
}

#[cfg(not(target_os = "linux"))]
pub(super) fn read() -> Option<Reading> {
    None
}
