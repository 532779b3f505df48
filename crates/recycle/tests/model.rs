//! `Recycled` against a plain `Vec` model: the same contents after any sequence of operations,
//! room that never shrinks, growth only when full and then to exactly twice the room (at least
//! the named start), and a spilled `SmallVec` that stays spilled.

use std::collections::VecDeque;

use cuhal_recycle::{Recycled, Storage};
use proptest::prelude::*;
use smallvec::SmallVec;

#[derive(Clone, Debug)]
enum Op {
    Push(u16),
    Pop,
    Clear,
    Extend(u8),
    ExtendFromSlice(u8),
    Refill(u8),
    ReserveTotal(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => any::<u16>().prop_map(Op::Push),
        2 => Just(Op::Pop),
        1 => Just(Op::Clear),
        1 => (0u8..40).prop_map(Op::Extend),
        1 => (0u8..40).prop_map(Op::ExtendFromSlice),
        1 => (0u8..40).prop_map(Op::Refill),
        1 => (0u16..300).prop_map(Op::ReserveTotal),
    ]
}

/// The room a full list of `capacity` must grow to.
fn doubled(start: usize, capacity: usize) -> usize {
    (2 * capacity).max(start).max(capacity + 1)
}

/// Runs `ops` on a `Recycled<S, START>` and the model, checking after each.
/// `extend_slice` is the storage's own way of adding a slice, where it has one.
fn check<S, const START: usize>(
    ops: &[Op],
    spilled: fn(&S) -> bool,
    extend_slice: fn(&mut Recycled<S, START>, &[u16]),
) where
    S: Storage<Item = u16> + std::fmt::Debug,
    for<'a> &'a S: IntoIterator<Item = &'a u16>,
{
    let mut list = Recycled::<S, START>::new();
    let mut model: Vec<u16> = Vec::new();
    let mut was_spilled = false;
    for op in ops {
        let before = list.capacity();
        match *op {
            Op::Push(x) => {
                let full = list.len() == before;
                list.push(x);
                model.push(x);
                if full {
                    assert_eq!(
                        list.capacity(),
                        doubled(START, before),
                        "{op:?} from {before}"
                    );
                } else {
                    assert_eq!(list.capacity(), before, "{op:?} grew a list with room");
                }
            }
            Op::Pop => assert_eq!(list.pop(), model.pop()),
            Op::Clear => {
                list.clear();
                model.clear();
            }
            Op::Extend(n) => {
                let items = (0..u16::from(n)).map(|i| i.wrapping_mul(7));
                list.extend(items.clone());
                model.extend(items);
            }
            Op::ExtendFromSlice(n) => {
                let items: Vec<u16> = (0..u16::from(n)).map(|i| i ^ 0x55).collect();
                extend_slice(&mut list, &items);
                model.extend_from_slice(&items);
            }
            Op::Refill(n) => {
                let mut next = 0u16;
                let added = list.refill(usize::from(n), || {
                    next += 1;
                    Some(next)
                });
                assert_eq!(added, usize::from(n));
                model.extend(1..=u16::from(n));
            }
            Op::ReserveTotal(total) => {
                let total = usize::from(total);
                list.reserve_total(total);
                assert!(list.capacity() >= total);
                if before >= total {
                    assert_eq!(
                        list.capacity(),
                        before,
                        "reserve_total grew a list with room"
                    );
                } else {
                    // Reached by doubling from the room it had.
                    let mut target = before;
                    while target < total {
                        target = doubled(START, target);
                    }
                    assert_eq!(list.capacity(), target);
                }
            }
        }
        let contents: Vec<u16> = (&list).into_iter().copied().collect();
        assert_eq!(contents, model, "after {op:?}");
        assert!(
            list.capacity() >= before,
            "{op:?} shrank the room from {before}"
        );
        assert!(list.capacity() >= list.len());
        assert_eq!(list.len(), model.len());
        if was_spilled {
            assert!(spilled(&list), "{op:?} gave back spilled storage");
        }
        was_spilled = spilled(&list);
    }
}

fn extend_by_items<S: Storage<Item = u16>, const START: usize>(
    list: &mut Recycled<S, START>,
    items: &[u16],
) {
    list.extend(items.iter().copied());
}

proptest! {
    #[test]
    fn a_vec_matches_the_model(ops in proptest::collection::vec(op(), 0..200)) {
        check::<Vec<u16>, 16>(&ops, |_| false, Recycled::extend_from_slice);
        check::<Vec<u16>, 1>(&ops, |_| false, Recycled::extend_from_slice);
        check::<Vec<u16>, 0>(&ops, |_| false, Recycled::extend_from_slice);
    }

    #[test]
    fn a_small_vec_matches_the_model_and_keeps_its_spill(ops in proptest::collection::vec(op(), 0..200)) {
        check::<SmallVec<[u16; 4]>, 16>(&ops, SmallVec::spilled, extend_by_items);
        check::<SmallVec<[u16; 4]>, 3>(&ops, SmallVec::spilled, extend_by_items);
    }

    #[test]
    fn a_ring_matches_the_model(ops in proptest::collection::vec(op(), 0..200)) {
        check::<VecDeque<u16>, 256>(&ops, |_| false, extend_by_items);
        check::<VecDeque<u16>, 5>(&ops, |_| false, extend_by_items);
    }
}

/// A list filled and emptied again and again grows only on the way up, through `START`, twice
/// it, four times it, and keeps that room for every later round.
#[test]
fn rounds_of_the_same_size_reuse_the_room() {
    let mut list = Recycled::<Vec<u64>, 16>::new();
    assert_eq!(list.capacity(), 0);
    let mut seen = Vec::new();
    for round in 0..10 {
        for i in 0..50 {
            list.push(i);
            if seen.last() != Some(&list.capacity()) {
                seen.push(list.capacity());
            }
        }
        assert_eq!(list.capacity(), 64, "round {round}");
        list.clear();
    }
    assert_eq!(seen, [16, 32, 64]);
}

/// A `SmallVec` stays inline up to its inline room, spills to the start, and keeps that
/// storage when emptied, by clear, pop or drain.
#[test]
fn a_spill_is_kept() {
    let mut list = Recycled::<SmallVec<[u32; 4]>, 16>::new();
    list.extend(0..4);
    assert!(!list.spilled());
    assert_eq!(list.capacity(), 4);
    list.push(4);
    assert!(list.spilled());
    assert_eq!(list.capacity(), 16);
    let address = list.as_ptr();
    list.clear();
    list.extend(0..3);
    while list.pop().is_some() {}
    list.extend(0..16);
    assert_eq!(list.drain(..).count(), 16);
    assert!(list.spilled());
    assert_eq!(list.capacity(), 16);
    list.extend(0..16);
    assert_eq!(list.as_ptr(), address, "the heap storage was replaced");
}

/// A ring's first push makes room for the start at once, and an out-of-order insert grows it by
/// the same doubling.
#[test]
fn a_ring_grows_from_its_start() {
    let mut ring = Recycled::<VecDeque<u32>, 8>::new();
    ring.push(1);
    assert_eq!(ring.capacity(), 8);
    ring.extend(3..10);
    assert_eq!(ring.len(), 8);
    ring.insert(1, 2);
    assert_eq!(ring.capacity(), 16);
    assert_eq!(
        ring.iter().copied().collect::<Vec<_>>(),
        (1..10).collect::<Vec<_>>()
    );
    assert_eq!(ring.drain(..4).count(), 4);
    assert_eq!(ring.pop_front(), Some(5));
    assert_eq!(ring.capacity(), 16);
}

/// A pool of spares that counts the objects it made: each refill doubles them (from the start),
/// `pop_warm` hands them out, and a list that takes them all back never grows past what the pool
/// made.
#[test]
fn a_pool_doubles_what_it_makes() {
    type Spares = Recycled<Vec<Box<u64>>, 16>;
    let mut spare = Spares::new();
    let mut returned = Spares::new();
    let mut made = 0;
    let mut refills = Vec::new();
    for in_flight in [10, 16, 17, 40, 100, 5] {
        let mut taken = Vec::new();
        for _ in 0..in_flight {
            if spare.is_empty() {
                let more = Spares::grown(made) - made;
                made += spare.refill(more, || Some(Box::new(0)));
                returned.reserve_total(made);
                refills.push(made);
            }
            taken.push(spare.pop_warm(|next| &raw const **next).unwrap());
        }
        let room = returned.capacity();
        returned.append(&mut taken);
        assert_eq!(returned.capacity(), room, "giving back grew the list");
        while let Some(item) = returned.pop() {
            spare.push(item);
        }
    }
    assert_eq!(refills, [16, 32, 64, 128]);
    assert_eq!(spare.len(), made);
}
