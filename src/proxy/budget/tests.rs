use super::*;
use crate::metrics::Metrics;

#[test]
fn a_charge_past_the_limit_is_refused_and_the_budget_unchanged() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 100, metrics.buffers());
    let (one, two) = (Arc::default(), Arc::default());
    let mut a = budget.charge(&one);
    assert_eq!(a.resize(60), Ok(()));
    let mut b = budget.charge(&two);
    assert_eq!(b.resize(50), Err(Short::Total));
    assert_eq!((budget.held(), two.held()), (60, 0));
    assert_eq!(b.resize(40), Ok(()));
    assert_eq!(budget.held(), 100);
    drop(a);
    assert_eq!((budget.held(), one.held()), (40, 0));
    assert_eq!(b.resize(10), Ok(()));
    assert_eq!((budget.held(), two.held()), (10, 10));
}

/// A request alone on its connection (holding only its own bytes) may go past the
/// connection's share, the total still bounding it; with anything else held there, or
/// once one has, it is refused as any charge is.
#[test]
fn a_request_alone_on_its_connection_may_go_past_its_share() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 30, metrics.buffers());
    let conn: Arc<ConnBuffers> = Arc::default();
    let mut own = budget.charge(&conn);
    assert_eq!(own.resize(5), Ok(()));
    let mut alone = budget.charge(&conn);
    assert_eq!(alone.resize(40), Err(Short::Connection));
    assert_eq!(alone.resize_alone(40, 5), Ok(()));
    assert_eq!((budget.held(), conn.held()), (45, 45));
    // A second one finds the connection holding more than its own.
    let mut second = budget.charge(&conn);
    assert_eq!(second.resize_alone(10, 5), Err(Short::Connection));
    drop(alone);
    // Past the total, never.
    assert_eq!(second.resize_alone(96, 5), Err(Short::Total));
    assert_eq!((budget.held(), conn.held()), (5, 5));
    // Something else held on the connection: the share holds.
    let mut other = budget.charge(&conn);
    assert_eq!(other.resize(10), Ok(()));
    assert_eq!(second.resize_alone(40, 5), Err(Short::Connection));
    assert_eq!((budget.held(), conn.held()), (15, 15));
}

/// A connection at its share is refused, the budget untouched, while another one
/// still takes what the total has room for.
#[test]
fn a_connection_holds_at_most_its_share() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 30, metrics.buffers());
    let (hoarder, other) = (Arc::default(), Arc::default());
    let mut first = budget.charge(&hoarder);
    assert_eq!(first.resize(20), Ok(()));
    let mut second = budget.charge(&hoarder);
    assert_eq!(second.resize(11), Err(Short::Connection));
    assert_eq!((budget.held(), hoarder.held()), (20, 20));
    assert_eq!(second.resize(10), Ok(()));
    assert_eq!(budget.charge(&other).resize(30), Ok(()));
    drop(first);
    assert_eq!((budget.held(), hoarder.held()), (10, 10));
    assert_eq!(second.resize(30), Ok(()));
}

/// `full` says which limit even one more byte would find no room under: the
/// connection's share first, as a charge looks, then the total.
#[test]
fn full_names_the_limit_one_byte_would_meet() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 60, metrics.buffers());
    let (hoarder, other) = (Arc::default(), Arc::default());
    let mut first = budget.charge(&hoarder);
    assert_eq!(first.resize(59), Ok(()));
    assert_eq!(budget.full(&hoarder), None);
    assert_eq!(first.resize(60), Ok(()));
    assert_eq!(budget.full(&hoarder), Some(Short::Connection));
    assert_eq!(budget.full(&other), None);
    let mut second = budget.charge(&other);
    assert_eq!(second.resize(40), Ok(()));
    assert_eq!(budget.full(&other), Some(Short::Total));
    drop(first);
    assert_eq!(budget.full(&hoarder), None);
}

/// A head is charged its fields as RFC 9113 counts them, and its method and target
/// as one more field.
#[test]
fn a_head_is_charged_its_fields_and_target() {
    let request = http::Request::post("http://a.example/orders?x=1")
        .header("idempotency-key", "k1")
        .header("x-pad", "p".repeat(100))
        .body(())
        .unwrap();
    let fields = (15 + 2 + 32) + (5 + 100 + 32);
    let target = "/orders?x=1".len() + "a.example".len();
    assert_eq!(head_size(&request), fields + 32 + 4 + target);
}

/// A head's bytes are given back when it drops, or, handed over, when what took them
/// drops; a head without room leaves the budget as it was.
#[test]
fn a_head_holds_its_bytes_until_it_or_its_hand_over_drops() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 50, metrics.buffers());
    let conn = Arc::default();
    let head = budget.head_charge(&conn);
    head.take(30).unwrap();
    let refused = budget.head_charge(&conn);
    assert_eq!(refused.take(21).err(), Some(Short::Connection));
    assert_eq!(refused.bytes(), 0);
    assert_eq!((budget.held(), conn.held()), (30, 30));
    let owner = head.hand_over();
    assert_eq!(head.bytes(), 0);
    drop(head);
    assert_eq!((budget.held(), conn.held()), (30, 30));
    drop(owner);
    assert_eq!((budget.held(), conn.held()), (0, 0));
    let other = Arc::default();
    let held = budget.head_charge(&other);
    held.take(50).unwrap();
    let more = budget.head_charge(&conn);
    more.take(50).unwrap();
    let third = Arc::default();
    assert_eq!(budget.head_charge(&third).take(1).err(), Some(Short::Total));
    assert_eq!((budget.held(), third.held()), (100, 0));
}

/// A charge shrunk gives back what it held past the size, and never takes more.
#[test]
fn a_shrunk_charge_gives_back_and_never_takes() {
    let metrics = Metrics::new();
    let budget = Budget::new(100, 100, metrics.buffers());
    let conn = Arc::default();
    let mut charge = budget.charge(&conn);
    assert_eq!(charge.resize(60), Ok(()));
    charge.shrink_to(40);
    assert_eq!((budget.held(), conn.held()), (40, 40));
    charge.shrink_to(1000);
    assert_eq!((budget.held(), conn.held()), (40, 40));
    drop(charge);
    assert_eq!(budget.held(), 0);
}

/// The charge lasts as long as any part of the buffer it was attached to.
#[test]
fn an_attached_charge_is_given_back_when_the_last_part_drops() {
    let metrics = Metrics::new();
    let budget = Budget::new(1000, 1000, metrics.buffers());
    let conn = Arc::default();
    let mut charge = budget.charge(&conn);
    assert_eq!(charge.resize(10), Ok(()));
    let mut whole = charge.attach(vec![7u8; 10]);
    let part = whole.split_to(4);
    drop(whole);
    assert_eq!((budget.held(), conn.held()), (10, 10));
    assert_eq!(&part[..], &[7u8; 4]);
    drop(part);
    assert_eq!((budget.held(), conn.held()), (0, 0));
}

/// Answers held by settlements made again in the background hold one connection's share
/// of the budget at most, within its total, until each is done.
#[test]
fn retried_answers_hold_one_connections_share_within_the_total() {
    let metrics = Metrics::new();
    let budget = Budget::new(90, 50, metrics.buffers());
    let room = RetriedAnswers::new(&budget);
    let first = room.take(30).expect("within the share");
    assert!(room.take(30).is_none(), "past the share");
    assert_eq!(budget.held(), 30, "counted in the budget");
    let client = Arc::default();
    let mut full = budget.charge(&client);
    full.resize(50).unwrap();
    assert!(room.take(20).is_none(), "past the total");
    drop(full);
    let second = room.take(20).expect("room again");
    drop((first, second));
    assert_eq!(budget.held(), 0, "given back");
}
