//! Canonical JSON: spelling, numbers, strings, ignored fields, limits, and extraction of
//! fields by pointer.

use super::*;

fn canon_with(input: &[u8], ignore: &IgnoreSet) -> Result<String, JsonError> {
    let mut out = Vec::new();
    canonical_json(input, ignore, &mut out, None)?;
    Ok(String::from_utf8(out).expect("canonical output is UTF-8"))
}

fn canon(input: &str) -> String {
    canon_with(input.as_bytes(), &IgnoreSet::empty()).unwrap_or_else(|e| panic!("{e} in {input:?}"))
}

fn err(input: &[u8]) -> JsonError {
    canon_with(input, &IgnoreSet::empty()).unwrap_err()
}

fn ptr(s: &str) -> JsonPointer {
    JsonPointer::parse(s).unwrap()
}

fn explain(input: &str, ignore: &IgnoreSet) -> (String, Vec<String>) {
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    canonical_json(input.as_bytes(), ignore, &mut out, Some(&mut ignored)).unwrap();
    (String::from_utf8(out).unwrap(), ignored)
}

/// Deterministic generator of documents and of different spellings of the same document.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    fn chance(&mut self, in_n: u64) -> bool {
        self.below(in_n) == 0
    }
}

mod extraction;
mod form;
mod limits;
mod order;
mod reference;
