//! The call tree (design §2): CallNodes keyed by (parent call node, func), with self and
//! running sample counts. Many stacks map to one call node, which is how frames of one
//! function at different addresses are grouped (seed 003).

use std::collections::HashMap;

use crate::profile::{FuncIndex, Profile};

/// Index into [`CallTree::nodes`]. Valid only for the tree it came from: transforms
/// build new trees, which is why users name nodes by CallNodePath instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallNodeIndex(pub u32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallNode {
    pub func: FuncIndex,
    pub parent: Option<CallNodeIndex>,
    pub children: Vec<CallNodeIndex>,
    /// Weight of the samples whose leaf is this node.
    pub self_weight: u64,
    /// Self weight of this node and all its descendants.
    pub running_weight: u64,
}

/// A call tree. Invariant: a node's parent comes before it in `nodes`.
#[derive(Clone, Debug, Default)]
pub struct CallTree {
    pub nodes: Vec<CallNode>,
    pub roots: Vec<CallNodeIndex>,
}

impl CallTree {
    /// The call tree of the samples of the threads `threads` (indexes into
    /// `profile.threads`) merged together.
    pub fn build(profile: &Profile, threads: &[usize]) -> CallTree {
        let mut tree = CallTree::default();
        let mut by_key: HashMap<(Option<CallNodeIndex>, FuncIndex), CallNodeIndex> = HashMap::new();
        // Stacks come after their prefixes, so one forward pass maps every stack.
        let mut stack_node: Vec<CallNodeIndex> = Vec::with_capacity(profile.stacks.len());
        for stack in &profile.stacks {
            let parent = stack.prefix.map(|p| stack_node[p.index()]);
            let func = profile.frames[stack.frame.index()].func;
            let node = *by_key.entry((parent, func)).or_insert_with(|| {
                let id = CallNodeIndex(tree.nodes.len() as u32);
                tree.nodes.push(CallNode {
                    func,
                    parent,
                    children: Vec::new(),
                    self_weight: 0,
                    running_weight: 0,
                });
                match parent {
                    Some(p) => tree.nodes[p.0 as usize].children.push(id),
                    None => tree.roots.push(id),
                }
                id
            });
            stack_node.push(node);
        }
        for &t in threads {
            for s in &profile.threads[t].samples {
                let node = stack_node[s.stack.index()];
                tree.nodes[node.0 as usize].self_weight += u64::from(s.weight);
            }
        }
        for i in (0..tree.nodes.len()).rev() {
            let n = &mut tree.nodes[i];
            n.running_weight += n.self_weight;
            let (running, parent) = (n.running_weight, n.parent);
            if let Some(p) = parent {
                tree.nodes[p.0 as usize].running_weight += running;
            }
        }
        // Nodes that no selected sample reaches are dropped from the child lists.
        let live = |tree: &CallTree, c: &CallNodeIndex| tree.nodes[c.0 as usize].running_weight > 0;
        let roots: Vec<_> = tree
            .roots
            .iter()
            .copied()
            .filter(|c| live(&tree, c))
            .collect();
        tree.roots = roots;
        for i in 0..tree.nodes.len() {
            let kids: Vec<_> = tree.nodes[i]
                .children
                .iter()
                .copied()
                .filter(|c| live(&tree, c))
                .collect();
            tree.nodes[i].children = kids;
        }
        tree
    }

    /// The call tree of every thread merged.
    pub fn all_threads(profile: &Profile) -> CallTree {
        let threads: Vec<usize> = (0..profile.threads.len()).collect();
        CallTree::build(profile, &threads)
    }

    pub fn node(&self, id: CallNodeIndex) -> &CallNode {
        &self.nodes[id.0 as usize]
    }

    /// Total weight of the tree.
    pub fn total(&self) -> u64 {
        self.roots
            .iter()
            .map(|&r| self.node(r).running_weight)
            .sum()
    }

    /// The node named by a CallNodePath of function names, root first.
    pub fn find_path(&self, profile: &Profile, path: &[&str]) -> Option<CallNodeIndex> {
        let mut candidates = &self.roots;
        let mut found = None;
        for name in path {
            let next = candidates
                .iter()
                .copied()
                .find(|&c| profile.func_name(self.node(c).func) == *name)?;
            found = Some(next);
            candidates = &self.node(next).children;
        }
        found
    }

    /// Children sorted for display: heaviest first, then by name.
    pub fn sorted_children(
        &self,
        profile: &Profile,
        children: &[CallNodeIndex],
    ) -> Vec<CallNodeIndex> {
        let mut v = children.to_vec();
        v.sort_by(|&a, &b| {
            let (na, nb) = (self.node(a), self.node(b));
            nb.running_weight
                .cmp(&na.running_weight)
                .then_with(|| profile.func_name(na.func).cmp(profile.func_name(nb.func)))
        });
        v
    }

    /// The tree in the one-line notation of design §3:
    /// `A:3,0 > B:3,0 > { C:2,0 > … ; H:1,0 > F:1,1 }` (name:running,self).
    pub fn to_compact_string(&self, profile: &Profile) -> String {
        let roots = self.sorted_children(profile, &self.roots);
        self.compact_list(profile, &roots)
    }

    fn compact_list(&self, profile: &Profile, nodes: &[CallNodeIndex]) -> String {
        match nodes {
            [] => String::new(),
            [one] => self.compact_node(profile, *one),
            many => {
                let parts: Vec<String> = many
                    .iter()
                    .map(|&n| self.compact_node(profile, n))
                    .collect();
                format!("{{ {} }}", parts.join(" ; "))
            }
        }
    }

    fn compact_node(&self, profile: &Profile, id: CallNodeIndex) -> String {
        let n = self.node(id);
        let head = format!(
            "{}:{},{}",
            profile.func_name(n.func),
            n.running_weight,
            n.self_weight
        );
        let kids = self.sorted_children(profile, &n.children);
        if kids.is_empty() {
            head
        } else {
            format!("{head} > {}", self.compact_list(profile, &kids))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_001_call_tree() {
        let p = Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
        ]);
        let tree = CallTree::all_threads(&p);
        assert_eq!(
            tree.to_compact_string(&p),
            "A:3,0 > B:3,0 > { C:2,0 > { D:1,0 > E:1,1 ; F:1,0 > G:1,1 } ; H:1,0 > F:1,1 }"
        );
        assert_eq!(tree.total(), 3);
        let c = tree.find_path(&p, &["A", "B", "C"]).unwrap();
        assert_eq!(tree.node(c).running_weight, 2);
        assert!(tree.find_path(&p, &["A", "C"]).is_none());
    }
}
