//! Which nodes a new graph node depends on: the barrier bookkeeping of a graph command buffer,
//! kept free of CUDA so it is tested on its own.
//!
//! Commands recorded between two barriers form a group: each depends only on the *frontier*
//! (what the last barrier left), so the group runs concurrently. A barrier makes the group the
//! new frontier. A group of one node is its own frontier; a wider group is first joined by one
//! empty node, so the next group's nodes each carry one dependency instead of the whole group
//! (N×M edges become N+M) and there is no limit on a group's width.

use smallvec::SmallVec;

/// Barrier bookkeeping over node handles `N`.
#[derive(Debug)]
pub(crate) struct Dependencies<N> {
    /// What every node of the current group depends on: nothing (at the start) or one node.
    frontier: SmallVec<[N; 1]>,
    /// The nodes (or chain tails) of the current group.
    group: Vec<N>,
}

impl<N: Copy> Default for Dependencies<N> {
    fn default() -> Self {
        Self {
            frontier: SmallVec::new(),
            group: Vec::new(),
        }
    }
}

impl<N: Copy> Dependencies<N> {
    /// The dependencies of the next node of the current group.
    pub(crate) fn frontier(&self) -> &[N] {
        &self.frontier
    }

    /// The nodes recorded since the last barrier.
    #[cfg(test)]
    pub(crate) fn group(&self) -> &[N] {
        &self.group
    }

    /// Records a node of the current group (created with [`Dependencies::frontier`] as its
    /// dependencies, or at the end of a chain that starts there).
    pub(crate) fn push(&mut self, node: N) {
        self.group.push(node);
    }

    /// Closes the current group. `join` creates an empty node depending on all of a group
    /// wider than one and returns it; it is not called otherwise. An empty group leaves the
    /// frontier as it was, so consecutive barriers add nothing.
    pub(crate) fn barrier<E>(&mut self, join: impl FnOnce(&[N]) -> Result<N, E>) -> Result<(), E> {
        match self.group.len() {
            0 => {}
            1 => {
                self.frontier.clear();
                self.frontier.push(self.group[0]);
            }
            _ => {
                let joined = join(&self.group)?;
                self.frontier.clear();
                self.frontier.push(joined);
            }
        }
        self.group.clear();
        Ok(())
    }

    /// Makes `node` the frontier: a serialization point (a tracing zone's event) created with
    /// the frontier as dependencies right after a barrier.
    pub(crate) fn fence(&mut self, node: N) {
        debug_assert!(self.group.is_empty(), "fence without a barrier first");
        self.frontier.clear();
        self.frontier.push(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy graph: each node lists its dependencies; `join` adds an "empty" node.
    #[derive(Default)]
    struct Toy {
        deps: Vec<Vec<usize>>,
        joins: Vec<usize>,
    }

    impl Toy {
        fn add(&mut self, deps: &[usize]) -> usize {
            self.deps.push(deps.to_vec());
            self.deps.len() - 1
        }

        /// Whether `a` must finish before `b` starts (transitively).
        fn before(&self, a: usize, b: usize) -> bool {
            let mut seen = vec![false; self.deps.len()];
            let mut stack = self.deps[b].clone();
            while let Some(n) = stack.pop() {
                if n == a {
                    return true;
                }
                if !std::mem::replace(&mut seen[n], true) {
                    stack.extend_from_slice(&self.deps[n]);
                }
            }
            false
        }
    }

    fn command(toy: &mut Toy, d: &mut Dependencies<usize>) -> usize {
        let n = toy.add(d.frontier());
        d.push(n);
        n
    }

    fn barrier(toy: &mut Toy, d: &mut Dependencies<usize>) {
        d.barrier::<()>(|group| {
            let j = toy.add(group);
            toy.joins.push(j);
            Ok(j)
        })
        .unwrap();
    }

    #[test]
    fn first_group_has_no_dependencies_and_runs_concurrently() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        let a = command(&mut toy, &mut d);
        let b = command(&mut toy, &mut d);
        assert!(toy.deps[a].is_empty() && toy.deps[b].is_empty());
        assert!(!toy.before(a, b) && !toy.before(b, a));
    }

    #[test]
    fn a_barrier_orders_groups_through_one_join() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        let first: Vec<usize> = (0..3).map(|_| command(&mut toy, &mut d)).collect();
        barrier(&mut toy, &mut d);
        let second: Vec<usize> = (0..4).map(|_| command(&mut toy, &mut d)).collect();
        assert_eq!(toy.joins.len(), 1);
        let join = toy.joins[0];
        assert_eq!(toy.deps[join], first);
        for &n in &second {
            assert_eq!(toy.deps[n], [join], "one dependency each");
            for &f in &first {
                assert!(toy.before(f, n));
            }
        }
        for (i, &a) in second.iter().enumerate() {
            for &b in &second[i + 1..] {
                assert!(!toy.before(a, b) && !toy.before(b, a));
            }
        }
    }

    #[test]
    fn a_group_of_one_needs_no_join_and_empty_barriers_add_nothing() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        let a = command(&mut toy, &mut d);
        barrier(&mut toy, &mut d);
        barrier(&mut toy, &mut d);
        barrier(&mut toy, &mut d);
        let b = command(&mut toy, &mut d);
        assert!(toy.joins.is_empty());
        assert_eq!(toy.deps[b], [a]);
        assert_eq!(toy.deps.len(), 2);
    }

    #[test]
    fn a_barrier_at_the_start_adds_nothing() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        barrier(&mut toy, &mut d);
        let a = command(&mut toy, &mut d);
        assert!(toy.deps[a].is_empty());
        assert!(toy.joins.is_empty());
    }

    #[test]
    fn groups_have_no_width_limit() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        let head = command(&mut toy, &mut d);
        barrier(&mut toy, &mut d);
        let wide: Vec<usize> = (0..1000).map(|_| command(&mut toy, &mut d)).collect();
        barrier(&mut toy, &mut d);
        let tail = command(&mut toy, &mut d);
        assert!(wide.iter().all(|&n| toy.deps[n] == [head]));
        let join = toy.joins[0];
        assert_eq!(toy.deps[join].len(), 1000);
        assert_eq!(toy.deps[tail], [join]);
        assert!(wide.iter().all(|&n| toy.before(n, tail)));
    }

    #[test]
    fn fences_serialize_everything_around_them() {
        let (mut toy, mut d) = (Toy::default(), Dependencies::default());
        let a = command(&mut toy, &mut d);
        let b = command(&mut toy, &mut d);
        barrier(&mut toy, &mut d);
        let fence = toy.add(d.frontier());
        d.fence(fence);
        let c = command(&mut toy, &mut d);
        assert!(toy.before(a, fence) && toy.before(b, fence));
        assert_eq!(toy.deps[c], [fence]);
    }

    #[test]
    fn a_failed_join_leaves_the_group_open() {
        let mut d = Dependencies::default();
        d.push(1usize);
        d.push(2);
        assert_eq!(d.barrier(|_| Err("no")), Err("no"));
        assert_eq!(d.group(), &[1, 2]);
    }

    proptest::proptest! {
        /// Any sequence of commands and barriers: a command depends on every command of every
        /// earlier group, and on no command of its own group.
        #[test]
        fn ordering_matches_barrier_semantics(ops in proptest::collection::vec(0u8..4, 0..60)) {
            let (mut toy, mut d) = (Toy::default(), Dependencies::default());
            let mut commands: Vec<(usize, usize)> = Vec::new(); // (node, group index)
            let mut group = 0;
            for op in ops {
                if op == 0 {
                    barrier(&mut toy, &mut d);
                    group += 1;
                } else {
                    commands.push((command(&mut toy, &mut d), group));
                }
            }
            for &(a, ga) in &commands {
                for &(b, gb) in &commands {
                    proptest::prop_assert_eq!(toy.before(a, b), ga < gb);
                }
            }
            for (n, deps) in toy.deps.iter().enumerate() {
                if !toy.joins.contains(&n) {
                    proptest::prop_assert!(deps.len() <= 1);
                }
            }
        }
    }
}
