//! The store contract: one `pub async fn(&Store)` per behaviour, each turned into a test
//! per backend by [`store_conformance!`], one file per topic.

mod claims;
mod leases;
mod outcomes;
mod purges;
mod records;
mod tokens;
mod waiters;

pub use claims::*;
pub use leases::*;
pub use outcomes::*;
pub use purges::*;
pub use records::*;
pub use tokens::*;
pub use waiters::*;
