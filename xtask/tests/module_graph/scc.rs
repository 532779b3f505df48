//! Strongly connected components of a small directed graph (Tarjan's algorithm), and one
//! cycle through a component, for reports.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A directed graph over named nodes: each node's successors.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The components with more than one node, each sorted, in sorted order. A node's edge to
/// itself is not a cycle here (a module may use itself).
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !tarjan.index.contains_key(node.as_str()) {
            tarjan.visit(node);
        }
    }
    let mut found: Vec<Vec<String>> = tarjan
        .found
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut c| {
            c.sort();
            c
        })
        .collect();
    found.sort();
    found
}

struct Tarjan<'g> {
    graph: &'g Graph,
    index: BTreeMap<&'g str, usize>,
    low: BTreeMap<&'g str, usize>,
    stack: Vec<&'g str>,
    on_stack: BTreeSet<&'g str>,
    next: usize,
    found: Vec<Vec<String>>,
}

impl<'g> Tarjan<'g> {
    /// Recursive: the graphs are a crate's modules, a few dozen nodes deep at most.
    fn visit(&mut self, node: &'g str) {
        self.index.insert(node, self.next);
        self.low.insert(node, self.next);
        self.next += 1;
        self.stack.push(node);
        self.on_stack.insert(node);
        for succ in self.graph.get(node).into_iter().flatten() {
            let succ = succ.as_str();
            if !self.index.contains_key(succ) {
                self.visit(succ);
                let low = self.low[succ].min(self.low[node]);
                self.low.insert(node, low);
            } else if self.on_stack.contains(succ) {
                let low = self.index[succ].min(self.low[node]);
                self.low.insert(node, low);
            }
        }
        if self.low[node] == self.index[node] {
            let mut component = Vec::new();
            while let Some(top) = self.stack.pop() {
                self.on_stack.remove(top);
                component.push(top.to_owned());
                if top == node {
                    break;
                }
            }
            self.found.push(component);
        }
    }
}

/// A shortest cycle through `component`'s first node that stays inside the component: the
/// nodes in order, the first repeated at the end.
pub fn cycle_through(graph: &Graph, component: &[String]) -> Vec<String> {
    let Some(start) = component.first() else {
        return Vec::new();
    };
    let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
    // Breadth first from `start` until an edge leads back to it.
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue: VecDeque<&str> = VecDeque::from([start.as_str()]);
    while let Some(node) = queue.pop_front() {
        for succ in graph.get(node).into_iter().flatten() {
            let succ = succ.as_str();
            if succ == start {
                let mut back = Vec::new();
                let mut at = node;
                while at != start {
                    back.push(at.to_owned());
                    at = parent[at];
                }
                back.reverse();
                let mut path = vec![start.clone()];
                path.extend(back);
                path.push(start.clone());
                return path;
            }
            if inside.contains(succ) && !parent.contains_key(succ) && succ != start {
                parent.insert(succ, node);
                queue.push_back(succ);
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry((*a).into()).or_default().insert((*b).into());
            g.entry((*b).into()).or_default();
        }
        g
    }

    #[test]
    fn finds_each_component_of_more_than_one_node() {
        let g = graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "d"),
            ("e", "f"),
            ("f", "e"),
            ("f", "g"),
        ]);
        assert_eq!(
            cycles(&g),
            vec![vec!["a", "b", "c"], vec!["e", "f"]]
                .into_iter()
                .map(|c| c.into_iter().map(String::from).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_acyclic_graph_has_none() {
        let g = graph(&[("a", "b"), ("b", "c"), ("a", "c")]);
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn the_cycle_shown_is_a_real_path_back_to_its_start() {
        let g = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("b", "a")]);
        let component: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(cycle_through(&g, &component), ["a", "b", "a"]);
        let g = graph(&[("a", "b"), ("b", "c"), ("c", "a")]);
        assert_eq!(cycle_through(&g, &component), ["a", "b", "c", "a"]);
    }
}
