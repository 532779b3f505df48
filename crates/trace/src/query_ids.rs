//! Tracy's GPU query ids: `u16`, handed out and taken back.
//!
//! Tracy keys an in-flight GPU timestamp by a 16-bit query id: the zone begin (or end) names the
//! id, and the timestamp uploaded later for that id completes it. An id may therefore be handed
//! out again only once its timestamp has been uploaded. IREE derived the id from the event's
//! index in a pool of 128K events, truncated to 16 bits, so two live zones could share an id.
//! Here ids are a resource of their own, independent of the event pool's size: a zone takes one
//! id per timestamp and gives it back after the upload; when all 65,536 are out (only possible
//! with that many timestamps in flight), the zone is dropped and counted instead.

/// The number of distinct query ids.
pub const QUERY_ID_COUNT: usize = 1 << 16;

/// A free list of `u16` query ids.
#[derive(Debug)]
pub struct QueryIds {
    /// Ids given back, reused first (most recently returned first, so hot ids stay hot).
    free: Vec<u16>,
    /// Ids never handed out yet are `next_fresh..QUERY_ID_COUNT`.
    next_fresh: u32,
    outstanding: usize,
}

impl Default for QueryIds {
    fn default() -> Self {
        Self::new()
    }
}

impl QueryIds {
    /// All 65,536 ids free; nothing is allocated until ids come back.
    pub const fn new() -> Self {
        Self {
            free: Vec::new(),
            next_fresh: 0,
            outstanding: 0,
        }
    }

    /// Takes an id, or `None` when every id is in flight.
    pub fn acquire(&mut self) -> Option<u16> {
        let id = match self.free.pop() {
            Some(id) => id,
            None if (self.next_fresh as usize) < QUERY_ID_COUNT => {
                let id = self.next_fresh as u16;
                self.next_fresh += 1;
                id
            }
            None => return None,
        };
        self.outstanding += 1;
        Some(id)
    }

    /// Takes two ids (a zone's begin and end), or none at all.
    pub fn acquire_pair(&mut self) -> Option<(u16, u16)> {
        if self.available() < 2 {
            return None;
        }
        let a = self.acquire()?;
        let b = self.acquire()?;
        Some((a, b))
    }

    /// Gives an id back; call only after its timestamp was uploaded.
    pub fn release(&mut self, id: u16) {
        debug_assert!(self.outstanding > 0, "query id {id} released twice");
        self.outstanding = self.outstanding.saturating_sub(1);
        self.free.push(id);
    }

    /// Ids in flight.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Ids that can be handed out now.
    pub fn available(&self) -> usize {
        QUERY_ID_COUNT - self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[test]
    fn all_ids_are_distinct_until_exhausted() {
        let mut ids = QueryIds::new();
        let mut seen = vec![false; QUERY_ID_COUNT];
        for _ in 0..QUERY_ID_COUNT {
            let id = ids.acquire().expect("an id") as usize;
            assert!(!seen[id], "id {id} handed out twice");
            seen[id] = true;
        }
        assert_eq!(ids.acquire(), None);
        assert_eq!(ids.acquire_pair(), None);
        assert_eq!(ids.outstanding(), QUERY_ID_COUNT);
        ids.release(77);
        assert_eq!(ids.acquire(), Some(77));
    }

    /// Far more than 65,536 zones go through, with up to 1,000 in flight: an id is never handed
    /// out while it is still in flight, and nothing runs out.
    #[test]
    fn recycling_past_65536_never_reuses_an_id_in_flight() {
        let mut ids = QueryIds::new();
        let mut in_flight = vec![false; QUERY_ID_COUNT];
        let mut queue = VecDeque::new();
        let mut handed_out = 0u64;
        for round in 0..300_000u64 {
            let (a, b) = ids
                .acquire_pair()
                .expect("ids never run out with 1,000 in flight");
            for id in [a, b] {
                assert!(
                    !in_flight[id as usize],
                    "id {id} reused while in flight (round {round})"
                );
                in_flight[id as usize] = true;
            }
            handed_out += 2;
            queue.push_back((a, b));
            // Uploads complete out of order now and then.
            if queue.len() > 1_000 {
                let (a, b) = if round % 7 == 0 {
                    queue.pop_back().unwrap()
                } else {
                    queue.pop_front().unwrap()
                };
                for id in [a, b] {
                    in_flight[id as usize] = false;
                    ids.release(id);
                }
            }
        }
        assert!(handed_out > 4 * QUERY_ID_COUNT as u64);
        assert_eq!(ids.outstanding(), queue.len() * 2);
    }

    #[test]
    fn a_pair_is_all_or_nothing() {
        let mut ids = QueryIds::new();
        for _ in 0..QUERY_ID_COUNT - 1 {
            ids.acquire().unwrap();
        }
        assert_eq!(ids.available(), 1);
        assert_eq!(ids.acquire_pair(), None);
        assert_eq!(ids.available(), 1, "a failed pair takes nothing");
    }
}
