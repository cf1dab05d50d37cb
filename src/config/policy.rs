//! What a protected route does with its requests: the [`Policy`] (windows, timeouts,
//! limits) and the choices it is made of ([`InFlightMode`], [`OnStoreError`],
//! [`OnUnknownOutcome`], [`StatusPattern`]), with the defaults every route starts from.
//! The choices are written in `proxy.yaml` as they are, so they read themselves from YAML.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// Timing and limits of a protected route.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a completed response is replayed: the route's `ttl`, else
    /// `defaults.fingerprint_ttl` for a key idemgate derives itself (fingerprint) and
    /// `defaults.ttl` for one the client or the business supplies.
    pub ttl: Duration,
    /// How long a claim outlives a vanished owner.
    pub lease: Duration,
    /// Longest wait for the upstream's full answer.
    pub upstream_timeout: Duration,
    /// What a duplicate of a running request gets.
    pub in_flight: InFlightMode,
    /// Longest hold of a duplicate in `wait` mode.
    pub wait_timeout: Duration,
    /// Which statuses are stored and replayed.
    pub replay_statuses: Vec<StatusPattern>,
    /// Largest request body buffered.
    pub max_body: usize,
    /// What a store failure means.
    pub on_store_error: OnStoreError,
    /// What a key whose request may have run, with no known outcome, becomes.
    pub on_unknown_outcome: OnUnknownOutcome,
    /// How long an owner keeps waiting for the upstream after its client got a 504, to
    /// store the answer for retries (at least `upstream_timeout`).
    pub background_timeout: Duration,
    /// Largest answer buffered and stored; a larger one streams to its client and the key
    /// records "executed, answer not stored".
    pub max_answer: usize,
    /// `idempotency: observe`: every request is forwarded unchanged, and what enforcing
    /// would have done (replay, hold, refuse) is only counted and logged.
    pub observe: bool,
}

impl Policy {
    /// Whether a response with `status` is stored for replay. The transient statuses
    /// ([`TRANSIENT_STATUSES`]) are released like a 5xx unless listed exactly: a class
    /// such as `4xx` does not cover them.
    pub fn replays(&self, status: u16) -> bool {
        if TRANSIENT_STATUSES.contains(&status) {
            return self.replay_statuses.contains(&StatusPattern::Exact(status));
        }
        self.replay_statuses.iter().any(|p| p.covers(status))
    }

    /// Whether an answer with `status` that is not replayed releases its key, so that a
    /// later request runs again: a 5xx or a transient status, which say the work was not
    /// done. Any other answer not replayed (a `3xx` with the default `replay_statuses`)
    /// may come from work that was done, such as a form's post/redirect/get: its key
    /// records "executed, answer not stored" instead, and its repeats never run.
    pub fn releases(&self, status: u16) -> bool {
        !self.replays(status) && (status >= 500 || TRANSIENT_STATUSES.contains(&status))
    }

    /// What this route's claim means once its owner stopped renewing it: held as an
    /// unknown outcome for the route's window (or the background bound, if longer), or
    /// taken over once the dead owner's call cannot still run (its lease plus the
    /// background bound after its last renewal).
    pub fn lapse(&self) -> crate::store::Lapse {
        match self.on_unknown_outcome {
            // Held at least as long as the dead owner's call could still run: an owner cut
            // off from its store (not dead at all) may run until `background_timeout`, and
            // a key that expired before that could run a second time beside it.
            OnUnknownOutcome::Hold => crate::store::Lapse::Hold {
                ttl: self.ttl.max(self.background_timeout),
            },
            OnUnknownOutcome::Release => crate::store::Lapse::Release {
                grace: self.background_timeout,
            },
        }
    }
}

/// Answers that say "not now" rather than "no": request timeout, conflict, too early, too
/// many requests. Replaying one would refuse the caller's retry forever.
pub const TRANSIENT_STATUSES: [u16; 4] = [408, 409, 425, 429];

/// How long a key idemgate derives itself (fingerprint) lives by default: long enough for
/// double clicks and retries after an upstream timeout, short enough that the same user
/// doing the same thing again later is not swallowed.
pub const DEFAULT_FINGERPRINT_TTL: Duration = Duration::from_secs(120);

impl Default for Policy {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            upstream_timeout: Duration::from_secs(60),
            in_flight: InFlightMode::Wait,
            wait_timeout: Duration::from_secs(10),
            replay_statuses: vec![StatusPattern::Class(2), StatusPattern::Class(4)],
            max_body: 1 << 20,
            on_store_error: OnStoreError::FailClosed,
            on_unknown_outcome: OnUnknownOutcome::Hold,
            background_timeout: Duration::from_secs(600),
            max_answer: 8 << 20,
            observe: false,
        }
    }
}

/// A status or class in `replay_statuses`: `201`, `"2xx"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusPattern {
    /// One status code.
    Exact(u16),
    /// A class: the hundreds digit.
    Class(u16),
}

impl StatusPattern {
    /// Whether `status` is covered.
    pub fn covers(self, status: u16) -> bool {
        match self {
            Self::Exact(s) => s == status,
            Self::Class(c) => status / 100 == c,
        }
    }
}

impl fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(s) => write!(f, "{s}"),
            Self::Class(c) => write!(f, "{c}xx"),
        }
    }
}

impl FromStr for StatusPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a status (201) or class (2xx)");
        if let Some(digit) = s.strip_suffix("xx") {
            let c: u16 = digit.parse().map_err(|_| bad())?;
            return (1..=5)
                .contains(&c)
                .then_some(Self::Class(c))
                .ok_or_else(bad);
        }
        let code: u16 = s.parse().map_err(|_| bad())?;
        (100..=599)
            .contains(&code)
            .then_some(Self::Exact(code))
            .ok_or_else(bad)
    }
}

impl<'de> Deserialize<'de> for StatusPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatusPattern;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status (201) or class (2xx)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                v.to_string().parse().map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::custom("expected a status, found a list"))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `in_flight:` — what a duplicate of a running request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightMode {
    /// Hold it until the first finishes, then replay (409 when `wait_timeout` passes).
    Wait,
    /// Answer 409 with `Retry-After` at once.
    Reject,
}

impl InFlightMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Reject => "reject",
        }
    }
}

/// `on_store_error:` — what a protected request gets when the store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// 503: never forward a protected request unprotected.
    FailClosed,
    /// Forward it unprotected (and count it).
    FailOpen,
}

impl OnStoreError {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClosed => "fail_closed",
            Self::FailOpen => "fail_open",
        }
    }
}

/// `on_unknown_outcome:` — what a key whose request may have run, with no known outcome,
/// becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknownOutcome {
    /// Held: its repeats get an "outcome unknown" problem until the window ends or an
    /// operator purges the key. Never executed twice.
    Hold,
    /// Released: a repeat executes again (for upstreams that are idempotent themselves).
    Release,
}

impl OnUnknownOutcome {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hold => "hold",
            Self::Release => "release",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lapse;

    #[test]
    fn a_held_key_outlives_every_call_its_dead_owner_could_still_run() {
        // A key idemgate derives itself lives 2 minutes; its owner's call up to 10.
        let derived = Policy {
            ttl: DEFAULT_FINGERPRINT_TTL,
            ..Policy::default()
        };
        assert_eq!(
            derived.lapse(),
            Lapse::Hold {
                ttl: derived.background_timeout
            }
        );
        let client_key = Policy::default();
        assert_eq!(
            client_key.lapse(),
            Lapse::Hold {
                ttl: client_key.ttl
            }
        );
    }

    #[test]
    fn only_failures_release_a_key_and_listed_statuses_never_do() {
        let policy = Policy::default();
        for released in [500, 502, 503, 504, 408, 409, 425, 429] {
            assert!(policy.releases(released), "{released}");
        }
        for kept in [200, 201, 204, 301, 302, 303, 304, 307, 400, 404, 422] {
            assert!(!policy.releases(kept), "{kept}");
        }
        let listed = Policy {
            replay_statuses: vec![StatusPattern::Class(2), StatusPattern::Exact(503)],
            ..Policy::default()
        };
        assert!(!listed.releases(503));
        assert!(listed.releases(500));
    }
}
