//! The statements both SQL databases have ([`Statements`]), their parameters ([`Arg`],
//! bound by [`bind`]) and the columns of their answers ([`Columns`]): a backend writes the
//! text of each statement in its own SQL, and the store states once which parameters each
//! takes and which columns each answers.

use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Type};

use super::decode;
use crate::store::StoreError;

/// The statements both databases have, with the table name in place.
pub struct Statements {
    /// Creating the tables and routines that are missing, sent in turn. PostgreSQL's is one
    /// simple query, which it runs as one transaction, after an advisory lock that replicas
    /// starting together take in turn; MySQL's are one statement each, and replicas
    /// starting together may both send them: MySQL serialises the DDL, and `IF NOT EXISTS`
    /// makes the second a no-op.
    pub schema: Vec<String>,
    /// The claim routine; parameters: key, token, fingerprint, lease ms, span ms, hold,
    /// issued-only, waiter, and (with notifications) mark. Its answer: the outcome, then a
    /// record's columns from 1.
    pub claim: String,
    /// The settle routine; parameters: key, token, fingerprint, kind, ttl ms, status,
    /// response, issued, writes-back. Its answer: the code in column 0.
    pub settle: String,
    /// The renew routine; parameters: key, token, fingerprint, lease ms, span ms, hold.
    pub renew: String,
    /// The purge routine; parameters: key, and the revision the row must be (state letter,
    /// token, created ms; a NULL state: whichever it is). Its answer: the code in column 0.
    pub purge: String,
    /// Writes an issued token; parameters: key, the empty fingerprint, ttl ms.
    pub issue: String,
    /// Counts a hit; parameters: key, window ms. Its answer: the count in column 0.
    pub hit: String,
    /// A record's columns from 0, then the observe-mode count and its last time; the key
    /// is bound three times.
    pub inspect: String,
    /// The count routine: a duplicate seen in observe mode; parameter: key. Its answer:
    /// when the record was made (Unix ms) in column 0, or NULL.
    pub seen: String,
    /// Deleting a batch of expired rows of the dedupe table, the hits and the counts.
    pub reap: [String; 3],
}

/// One parameter of a statement.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    /// A digest or a token.
    Bytes(&'a [u8]),
    /// A hex digest (a notification's payload).
    Text(&'a str),
    /// Milliseconds.
    Int(i64),
    /// A flag.
    Flag(bool),
    /// A record's kind as [`super::Written`] has it (`None`: delete).
    Kind(Option<u8>),
    /// An upstream status.
    Status(Option<i16>),
    /// A stored response.
    Blob(Option<&'a [u8]>),
}

/// `sql` with `args` bound; `kind` turns a record's kind into the database's own type.
pub fn bind<'q, DB, K>(
    sql: &'q str,
    args: &[Arg<'q>],
    kind: impl Fn(Option<u8>) -> K,
) -> Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    K: 'q + Encode<'q, DB> + Type<DB>,
    &'q [u8]: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Option<i16>: Encode<'q, DB> + Type<DB>,
    Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
{
    args.iter()
        .fold(sqlx::query::<DB>(sql), |query, arg| match *arg {
            Arg::Bytes(bytes) => query.bind(bytes),
            Arg::Text(text) => query.bind(text),
            Arg::Int(n) => query.bind(n),
            Arg::Flag(flag) => query.bind(flag),
            Arg::Kind(k) => query.bind(kind(k)),
            Arg::Status(status) => query.bind(status),
            Arg::Blob(blob) => query.bind(blob),
        })
}

/// The columns a SQL store reads, by position: the rows of a prepared MySQL `CALL` come
/// without column names.
pub trait Columns {
    /// Bytes or NULL.
    fn bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError>;
    /// A small integer or NULL.
    fn small(&self, i: usize) -> Result<Option<i16>, StoreError>;
    /// A big integer.
    fn int(&self, i: usize) -> Result<i64, StoreError>;
    /// A big integer or NULL.
    fn maybe_int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    /// A boolean.
    fn flag(&self, i: usize) -> Result<bool, StoreError>;
}

impl<R> Columns for R
where
    R: sqlx::Row,
    usize: ColumnIndex<R>,
    for<'r> Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i16>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError> {
        self.try_get(i).map_err(decode)
    }
    fn small(&self, i: usize) -> Result<Option<i16>, StoreError> {
        self.try_get(i).map_err(decode)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.try_get(i).map_err(decode)
    }
    fn maybe_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(i).map_err(decode)
    }
    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        self.try_get(i).map_err(decode)
    }
}
