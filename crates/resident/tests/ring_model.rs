//! The ring against a `VecDeque` model: any sequence of pushes and pops, on small capacities so
//! that it wraps many times, gives the same answers (full when the model holds the capacity,
//! descriptors out in order with their sequence numbers).
#![cfg(not(loom))]

use std::collections::VecDeque;

use cuhal_resident::{Descriptor, Full, HostMemory, SlotValue, split};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Push(u64),
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![any::<u64>().prop_map(Op::Push), Just(Op::Pop)]
}

proptest! {
    #[test]
    fn ring_matches_a_deque(capacity in 1usize..6, ops in proptest::collection::vec(op(), 0..200)) {
        let (mut producer, mut consumer) = split(HostMemory::new(capacity, 0).unwrap()).unwrap();
        let mut model: VecDeque<(u64, u64)> = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Push(handle) => {
                    let mut d = Descriptor { executable: handle, wait_count: 1, ..Descriptor::default() };
                    d.waits[0] = SlotValue { value: handle, slot: 3, reserved: 0 };
                    let got = producer.try_push(d);
                    if model.len() == capacity {
                        prop_assert_eq!(got, Err(Full { capacity }));
                    } else {
                        prop_assert_eq!(got, Ok(next));
                        model.push_back((next, handle));
                        next += 1;
                    }
                }
                Op::Pop => {
                    let got = consumer.peek().unwrap();
                    match model.pop_front() {
                        None => {
                            prop_assert!(got.is_none());
                            prop_assert!(!consumer.advance());
                        }
                        Some((sequence, handle)) => {
                            let d = got.unwrap();
                            prop_assert_eq!(d.sequence, sequence);
                            prop_assert_eq!(d.executable, handle);
                            prop_assert_eq!(d.waits(), &[SlotValue { value: handle, slot: 3, reserved: 0 }][..]);
                            prop_assert!(consumer.advance());
                        }
                    }
                }
            }
            prop_assert_eq!(consumer.has_work(), !model.is_empty());
            prop_assert_eq!(producer.produced(), next);
        }
    }
}

#[test]
fn a_zero_capacity_is_refused() {
    assert!(HostMemory::new(0, 0).is_err());
}
