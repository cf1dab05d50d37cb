//! Method names a route lists, against the IANA HTTP method registry: any token loads (an
//! application may take its own methods), so a misspelled one (`DELTE`) would load too,
//! and the method meant would then miss the route. `check` notes a name the registry does
//! not hold, with the registered method nearest to it.

use http::Method;

/// The IANA HTTP method registry, those a route may list first (neither safe, which always
/// pass through, nor `CONNECT`), the usual ones ahead so that they win a tie for nearest.
/// `QUERY` (the IETF's safe method with a body) is counted as known too.
const ROUTABLE: &[&str] = &[
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "COPY",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "ORDERPATCH",
    "PRI",
    "PROPFIND",
    "PROPPATCH",
    "QUERY",
    "REBIND",
    "REPORT",
    "SEARCH",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
];

/// A name further than this many edits from every registered method gets no suggestion:
/// it is likelier the application's own (`PURGE` is two from `MERGE`) than a slip.
const MAX_EDITS: usize = 1;

/// What `check` says of `method` on `route`, when the registry does not hold it.
pub(super) fn unregistered_note(route: &str, method: &Method) -> Option<String> {
    let name = method.as_str();
    if crate::route::is_safe(method) || *method == Method::CONNECT || ROUTABLE.contains(&name) {
        return None;
    }
    let guess = match nearest(name) {
        Some(near) => format!(
            "did you mean {near}? Requests with {near} are not this route's: they get another route, the fallback (POST, PATCH) or, with none, pass through unprotected. "
        ),
        None => String::new(),
    };
    Some(format!(
        "route {route}: method {name} is not in the IANA HTTP method registry, so only requests naming it exactly match; {guess}If the application takes {name}, nothing is wrong"
    ))
}

/// The registered method fewest edits from `name`, if within [`MAX_EDITS`].
fn nearest(name: &str) -> Option<&'static str> {
    ROUTABLE
        .iter()
        .map(|m| (*m, edits(name.as_bytes(), m.as_bytes())))
        .filter(|(_, d)| *d <= MAX_EDITS)
        .min_by_key(|(_, d)| *d)
        .map(|(m, _)| m)
}

/// Insertions, deletions, substitutions and swaps of two neighbours turning `a` into `b`
/// (optimal string alignment): a swap (`PSOT`) is one slip, not two.
fn edits(a: &[u8], b: &[u8]) -> usize {
    let mut rows = vec![(0..=b.len()).collect::<Vec<_>>(); a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slips_find_the_method_meant() {
        assert_eq!(nearest("DELTE"), Some("DELETE"));
        assert_eq!(nearest("PSOT"), Some("POST"));
        assert_eq!(nearest("PUTT"), Some("PUT"));
        assert_eq!(nearest("PACTH"), Some("PATCH"));
        assert_eq!(nearest("PURGE"), None);
        assert_eq!(edits(b"", b"PUT"), 3);
    }

    #[test]
    fn registered_and_safe_methods_draw_no_note() {
        for name in ["POST", "PROPPATCH", "VERSION-CONTROL", "GET"] {
            let method = Method::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(unregistered_note("r", &method), None, "{name}");
        }
    }
}
