//! The differential test of issue 24: the same upstream answer bytes through hyper's client
//! (the default path) and through the hand-written parser and decoder, compared on what
//! reaches the proxy (status, fields, body, trailers), on where the answer ends (a second
//! request on the connection gets the same next answer, or both sides close it), or on
//! both refusing. The answers are a corpus of the constructs HTTP/1.1 parsers have read
//! differently ([`corpus`]) and a grammar of them (`answer_grammar`) that proptest draws
//! from; each arrives at the hand-written side whole, byte by byte, cut in two at every
//! point and cut at random, and must come out the same every way.
//!
//! A difference fails unless it is in the allow-list [`Stricter`]: the hand-written side
//! refusing what hyper takes, each for a reason of RFC 9112. Never the other way round.

mod chunked_corpus;
mod corpus;
mod harness;

use proptest::prelude::*;
use proptest::sample::Index;

use super::answer_grammar::{self, split};
use harness::{hand_written, hyper, Answer, Outcome};

/// Where the hand-written side may refuse what hyper's client takes: the allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stricter {
    /// A chunk size of more than 15 hex digits, leading zeros included; hyper reads any
    /// number that does not overflow a u64.
    ChunkSizeDigits,
    /// A control character other than HTAB in a chunk extension; hyper skips every byte
    /// there but CR and LF.
    ExtensionControl,
    /// A chunk line longer than 4 KiB; hyper allows 16 KiB of extensions per body.
    ChunkLineLength,
    /// A trailer line ended by a bare LF; hyper takes one (and refuses two).
    TrailerLineEnd,
    /// A head longer than hyper's read buffer limit (`head::MAX_HEAD`); hyper checks its
    /// limit between reads, so a head whose last read overshoots it passes.
    HeadSize,
}

impl Stricter {
    /// Why refusing is right.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Self::ChunkSizeDigits => {
                "RFC 9112 §7.1: recipients MUST anticipate large hexadecimal numerals and \
                 prevent parsing errors due to integer overflow; 15 digits never overflow"
            }
            Self::ExtensionControl => {
                "RFC 9112 §7.1.1: a chunk extension is tokens and quoted strings, neither of \
                 which holds a control character; a stray CR or DEL there is what another \
                 parser may take for a line end"
            }
            Self::ChunkLineLength => {
                "RFC 9112 §7.1.1: a recipient SHOULD limit the total length of chunk \
                 extensions it takes"
            }
            Self::TrailerLineEnd => {
                "RFC 9112 §2.2: a recipient MAY take a bare LF for a line end, and §7.1 ends \
                 every chunk line with CRLF; taking it in trailers is where hyper counts \
                 lines one way and parses them another"
            }
            Self::HeadSize => {
                "RFC 9110 §5.4: a recipient may refuse a field section larger than it \
                 wishes to process; the limit holds whatever the reads"
            }
        }
    }
}

/// Whether `hand` may differ from `hyper` because of one of `allowed`: the hand-written
/// side refused the answer, or failed its body, where hyper took it, and nothing else
/// differs.
fn is_allowed(hand: &Outcome, hyper: &Outcome, allowed: &[Stricter]) -> bool {
    if allowed.is_empty() {
        return false;
    }
    match (hand, hyper) {
        (Outcome::Refused, Outcome::Answer(_)) => true,
        (Outcome::Answer(hand), Outcome::Answer(hyper)) => {
            hand.body.is_none()
                && hyper.body.is_some()
                && Answer {
                    body: None,
                    next: harness::Next::Closed,
                    ..hyper.clone()
                } == *hand
        }
        _ => false,
    }
}

/// The reads `wire` is cut into for the hand-written side: whole, byte by byte (if
/// short), cut once at every position (if shorter still), and at `cuts`.
fn readings<'a>(wire: &'a [u8], cuts: &[Vec<Index>]) -> Vec<Vec<&'a [u8]>> {
    let mut readings = vec![vec![wire]];
    if wire.len() <= 4096 {
        readings.push(wire.chunks(1).collect());
    }
    if wire.len() <= 512 {
        readings.extend((1..wire.len()).map(|at| vec![&wire[..at], &wire[at..]]));
    }
    readings.extend(cuts.iter().map(|cuts| split(wire, cuts)));
    readings
}

/// What the two sides made of an answer, when it passes.
struct Agreed {
    /// hyper's outcome.
    reference: Outcome,
    /// Whether the hand-written side differed, as `allowed` lets it.
    stricter: bool,
}

/// Runs `wire` through both sides, the hand-written one also with the bytes cut at
/// `cuts`, and says how they differ, if they do beyond `allowed`.
fn check(
    method: &http::Method,
    wire: &[u8],
    allowed: &[Stricter],
    cuts: &[Vec<Index>],
) -> Result<Agreed, String> {
    let reference = hyper(method, wire);
    let readings = readings(wire, cuts);
    let whole = hand_written(method, &readings[0]);
    for reads in &readings[1..] {
        let cut = hand_written(method, reads);
        if cut != whole {
            return Err(format!(
                "the hand-written side differs with the bytes in {} reads \
                 {:?}:\n  whole: {whole:?}\n  cut:   {cut:?}",
                reads.len(),
                reads
                    .iter()
                    .map(|read| harness::show(read))
                    .collect::<Vec<_>>()
            ));
        }
    }
    if whole != reference && !is_allowed(&whole, &reference, allowed) {
        return Err(format!(
            "{method} answered {}:\n  hyper:        {reference:?}\n  hand-written: {whole:?}",
            harness::show(wire)
        ));
    }
    Ok(Agreed {
        stricter: whole != reference,
        reference,
    })
}

#[test]
fn the_corpus_reads_the_same_on_both_sides() {
    let mut failures = Vec::new();
    for case in corpus::cases() {
        let agreed = match check(&case.method, &case.wire, &case.stricter, &[]) {
            Ok(agreed) => agreed,
            Err(why) => {
                failures.push(format!("{}: {why}", case.name));
                continue;
            }
        };
        if let Err(why) = case.expect.holds(&agreed.reference) {
            failures.push(format!(
                "{}: hyper {why}: {:?}",
                case.name, agreed.reference
            ));
        }
        // An allow-list entry stands only while a case shows it.
        match (agreed.stricter, case.stricter.is_empty()) {
            (false, false) => failures.push(format!(
                "{}: marked stricter, but both sides read it the same",
                case.name
            )),
            (true, _) => {
                let reasons: Vec<_> = case.stricter.iter().map(|s| s.reason()).collect();
                eprintln!("{}: the hand-written side refuses ({reasons:?})", case.name);
            }
            (false, true) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        ..ProptestConfig::default()
    })]

    #[test]
    fn answers_of_the_grammar_read_the_same_on_both_sides(
        answer in answer_grammar::answer(),
        cuts in prop::collection::vec(answer_grammar::cuts(6), 2),
    ) {
        if let Err(why) = check(&answer.method, &answer.wire, &answer.stricter, &cuts) {
            prop_assert!(false, "{}", why);
        }
    }
}
