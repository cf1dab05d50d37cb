//! An answer the database refuses every time it is written (a trigger or constraint that
//! rejects it, MySQL's error 1118 for a row too large for its redo log): the request ran,
//! so its key records "executed, answer not stored", and a repeat is told so instead of
//! running again once the claim would have lapsed.

use http::StatusCode;

use crate::common::{mariadb_server, postgres_server};
use crate::common::{post, start_proxy, start_upstream};
use crate::until;

/// A proxy on `store` (a `store:` entry naming table `table`) whose claims lapse into a
/// release a moment after their owner stops renewing them.
fn releasing(store: &str) -> String {
    format!(
        "store:\n  {store}\n\
         defaults: {{ lease: 300ms, upstream_timeout: 700ms, background_timeout: 700ms, \
         on_unknown_outcome: release }}\nroutes:\n  - name: create-order\n    \
         match: {{ methods: [POST], path: /orders }}\n    \
         key: {{ header: Idempotency-Key, required: true }}\n"
    )
}

/// Posts `key` once with the table ready (`refuse` then makes it refuse done records),
/// waits until the key's claim has ended one way or the other, and posts it again: the
/// repeat must not run, and must say the request ran.
async fn refused_answer_is_never_rerun(
    store: &str,
    refuse: impl FnOnce(),
    live: impl Fn() -> String,
    key: &str,
) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &releasing(store)).await;
    // The first request creates the table, so the trigger has one to go on.
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);
    refuse();
    let headers = [("idempotency-key", key)];
    let first = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(
        first.status,
        StatusCode::CREATED,
        "the client gets its answer"
    );
    // Settled one way or the other: recorded, or its claim gone past lease and grace,
    // to be taken over.
    until(|| live().trim().is_empty(), "the claim to end").await;
    let repeat = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(
        upstream.executed_for(key),
        1,
        "ran again: the repeat answered {}",
        repeat.status
    );
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert!(
        repeat.problem().contains("answer-not-stored"),
        "the repeat is not told the request ran: {}",
        repeat.problem()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_answer_a_trigger_refuses_is_recorded_as_not_stored_and_never_rerun() {
    let db = mariadb_server::shared();
    let store = format!(
        "mysql: {{ url: \"{}\", table: refused_answers, timeout: 1s }}",
        db.url()
    );
    let refuse = || {
        for event in ["INSERT", "UPDATE"] {
            db.sql(&format!(
                "DELIMITER //\n\
                 CREATE TRIGGER idemgate.refuse_done_{event} BEFORE {event} \
                 ON idemgate.refused_answers FOR EACH ROW \
                 IF NEW.kind = 'D' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no answers here'; \
                 END IF//"
            ));
        }
    };
    let live = || {
        db.sql(
            "SELECT kind FROM idemgate.refused_answers
             WHERE expires_at > UTC_TIMESTAMP(3) AND kind = 'I'",
        )
    };
    refused_answer_is_never_rerun(&store, refuse, live, "refused-mariadb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_answer_a_trigger_refuses_is_recorded_as_not_stored_and_never_rerun() {
    let db = postgres_server::shared();
    let store = format!(
        "postgres: {{ url: \"{}\", table: refused_answers, timeout: 1s }}",
        db.url()
    );
    let refuse = || {
        db.psql(
            "CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.kind = 'D' THEN RAISE EXCEPTION 'no answers here'; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER refuse_done BEFORE INSERT OR UPDATE ON refused_answers \
             FOR EACH ROW EXECUTE FUNCTION refuse_done();",
        );
    };
    let live =
        || db.psql("SELECT kind FROM refused_answers WHERE expires_at > now() AND kind = 'I'");
    refused_answer_is_never_rerun(&store, refuse, live, "refused-postgres").await;
}
