//! Prefix index over token ids: which worker probably holds which prompt prefix in its KV
//! cache (the cache-aware policy routes a prompt to the worker that shares most of it).
//!
//! A radix tree: every edge holds a run of token ids; every node records the workers that
//! were sent a prompt passing through it, with the logical time they last were. The index
//! is approximate: it learns from what the router sent, not from the worker's cache, so it
//! evicts on its own: each worker's share is capped (`evict`) by dropping its least
//! recently used leaves first, as the worker's LRU radix cache would.

use std::collections::HashMap;

const ROOT: usize = 0;

#[derive(Default)]
struct Node {
    /// Token ids on the edge from the parent into this node.
    key: Vec<u32>,
    parent: usize,
    children: HashMap<u32, usize>,
    /// worker -> logical time of its last prompt through this node.
    workers: HashMap<usize, u64>,
}

#[derive(Default)]
pub struct PrefixIndex {
    nodes: Vec<Node>,
    free: Vec<usize>,
    clock: u64,
    /// Tokens each worker holds in the index (the sum of its nodes' key lengths).
    tokens: HashMap<usize, usize>,
}

impl PrefixIndex {
    pub fn new() -> Self {
        Self {
            nodes: vec![Node::default()],
            ..Self::default()
        }
    }

    /// For each worker that shares a prefix with `ids`: the length of the longest one.
    pub fn match_prefix(&self, ids: &[u32]) -> HashMap<usize, usize> {
        let mut matched = HashMap::new();
        let (mut node, mut depth) = (ROOT, 0);
        while depth < ids.len() {
            let Some(&child) = self.nodes[node].children.get(&ids[depth]) else {
                break;
            };
            let common = common_prefix(&self.nodes[child].key, &ids[depth..]);
            depth += common;
            for &w in self.nodes[child].workers.keys() {
                matched.insert(w, depth);
            }
            if common < self.nodes[child].key.len() {
                break;
            }
            node = child;
        }
        matched
    }

    /// Records that `ids` was sent to `worker`.
    pub fn insert(&mut self, ids: &[u32], worker: usize) {
        self.clock += 1;
        let (mut node, mut depth) = (ROOT, 0);
        while depth < ids.len() {
            let child = match self.nodes[node].children.get(&ids[depth]) {
                Some(&child) => child,
                None => self.add_child(node, ids[depth..].to_vec()),
            };
            let common = common_prefix(&self.nodes[child].key, &ids[depth..]);
            if common < self.nodes[child].key.len() {
                self.split(child, common);
            }
            self.touch(child, worker);
            depth += common;
            node = child;
        }
    }

    pub fn tokens_of(&self, worker: usize) -> usize {
        self.tokens.get(&worker).copied().unwrap_or(0)
    }

    /// Drops `worker`'s least recently used leaves until it holds at most `capacity` tokens.
    pub fn evict(&mut self, worker: usize, capacity: usize) {
        while self.tokens_of(worker) > capacity {
            let mut leaves: Vec<(u64, usize)> = (1..self.nodes.len())
                .filter(|&n| self.is_leaf_of(n, worker))
                .map(|n| (self.nodes[n].workers[&worker], n))
                .collect();
            if leaves.is_empty() {
                return;
            }
            leaves.sort_unstable();
            for (_, n) in leaves {
                if self.tokens_of(worker) <= capacity {
                    return;
                }
                self.forget(n, worker);
            }
        }
    }

    fn touch(&mut self, node: usize, worker: usize) {
        let len = self.nodes[node].key.len();
        if self.nodes[node]
            .workers
            .insert(worker, self.clock)
            .is_none()
        {
            *self.tokens.entry(worker).or_default() += len;
        }
    }

    /// A node `worker` is on while none of its children is: the end of one of its prefixes.
    fn is_leaf_of(&self, node: usize, worker: usize) -> bool {
        let n = &self.nodes[node];
        n.workers.contains_key(&worker)
            && n.children
                .values()
                .all(|&c| !self.nodes[c].workers.contains_key(&worker))
    }

    fn forget(&mut self, node: usize, worker: usize) {
        if self.nodes[node].workers.remove(&worker).is_some() {
            *self.tokens.entry(worker).or_default() -= self.nodes[node].key.len();
        }
        if self.nodes[node].workers.is_empty() && self.nodes[node].children.is_empty() {
            let parent = self.nodes[node].parent;
            let first = self.nodes[node].key[0];
            self.nodes[parent].children.remove(&first);
            self.nodes[node] = Node::default();
            self.free.push(node);
        }
    }

    fn add_child(&mut self, parent: usize, key: Vec<u32>) -> usize {
        let first = key[0];
        let node = Node {
            key,
            parent,
            ..Node::default()
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.nodes[parent].children.insert(first, id);
        id
    }

    /// Splits `node`'s edge after `at` tokens; `node` keeps the head, a new child the tail.
    fn split(&mut self, node: usize, at: usize) {
        let tail = self.nodes[node].key.split_off(at);
        let children = std::mem::take(&mut self.nodes[node].children);
        let workers = self.nodes[node].workers.clone();
        let child = self.add_child(node, tail);
        for &c in children.values() {
            self.nodes[c].parent = child;
        }
        self.nodes[child].children = children;
        self.nodes[child].workers = workers;
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_shared_prefix_per_worker() {
        let mut index = PrefixIndex::new();
        index.insert(&[1, 2, 3, 4], 0);
        index.insert(&[1, 2, 9], 1);
        let m = index.match_prefix(&[1, 2, 3, 7]);
        assert_eq!((m[&0], m[&1]), (3, 2));
        assert!(index.match_prefix(&[5]).is_empty());
        assert_eq!(index.match_prefix(&[1, 2, 3, 4, 5])[&0], 4);
    }

    #[test]
    fn token_counts_follow_inserts_and_splits() {
        let mut index = PrefixIndex::new();
        index.insert(&[1, 2, 3, 4], 0);
        index.insert(&[1, 2, 3, 4], 0);
        assert_eq!(index.tokens_of(0), 4);
        index.insert(&[1, 2, 8], 0);
        assert_eq!(index.tokens_of(0), 5);
        index.insert(&[1, 2], 1);
        assert_eq!(index.tokens_of(1), 2);
    }

    #[test]
    fn eviction_drops_least_recently_used_leaves_first() {
        let mut index = PrefixIndex::new();
        index.insert(&[1, 2, 3], 0);
        index.insert(&[7, 8, 9], 0);
        index.insert(&[1, 2, 3], 1);
        index.insert(&[1, 2, 3], 0); // now [7, 8, 9] is the older one
        index.evict(0, 3);
        assert_eq!(index.tokens_of(0), 3);
        assert!(index.match_prefix(&[7, 8, 9]).is_empty());
        assert_eq!(index.match_prefix(&[1, 2, 3])[&0], 3);
        // Worker 1's entries are untouched; freed nodes are reused.
        assert_eq!(index.match_prefix(&[1, 2, 3])[&1], 3);
        index.insert(&[4, 4], 2);
        assert_eq!(index.nodes.len(), 3, "root, [1 2 3], and the reused node");
    }

    #[test]
    fn eviction_of_everything_empties_the_tree() {
        let mut index = PrefixIndex::new();
        for i in 0..50u32 {
            index.insert(&[i % 5, i, i + 1], 0);
        }
        index.evict(0, 0);
        assert_eq!(index.tokens_of(0), 0);
        assert!(index.nodes[ROOT].children.is_empty());
    }
}
