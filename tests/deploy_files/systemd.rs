//! The systemd unit: it runs idemgate, reloads on SIGHUP and outlasts the drain.

use idemgate::config::units::parse_duration;

use crate::support::*;

/// `Key=value` settings of a unit file, in order (keys such as ExecReload may repeat).
pub(crate) fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';', '[']))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_systemd_unit_runs_idemgate_reloads_on_sighup_and_outlasts_the_drain() {
    let settings = unit_settings(&read("systemd/idemgate.service"));
    let all = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let start = all("ExecStart");
    assert_eq!(start.len(), 1, "one ExecStart");
    let words: Vec<&str> = start[0].split_whitespace().collect();
    assert!(words[0].ends_with("/idemgate"), "ExecStart {:?}", start[0]);
    assert_eq!(words.get(1), Some(&"run"), "ExecStart {:?}", start[0]);
    assert!(
        all("ExecReload")
            .iter()
            .any(|r| r.contains("kill -HUP $MAINPID")),
        "no ExecReload sending SIGHUP"
    );
    let drain =
        parse_config("deploy/systemd/proxy.yaml", &read("systemd/proxy.yaml")).drain_timeout;
    let stop = all("TimeoutStopSec");
    let stop = parse_duration(stop.last().expect("TimeoutStopSec")).expect("a duration");
    assert!(
        stop > drain,
        "TimeoutStopSec {stop:?} <= drain_timeout {drain:?}"
    );
    assert_eq!(
        all("DynamicUser"),
        ["yes"],
        "not a dynamic, unprivileged user"
    );
}
