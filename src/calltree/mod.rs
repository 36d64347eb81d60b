//! The call tree (docs/design.md §2, §3): CallNodes keyed by (parent call node, func), with self
//! and running sample weights, the transforms that reshape it, and per-line counts.
//!
//! Many stacks map to one call node, which is how frames of one function at different
//! addresses are grouped (seed 003). A tree keeps its own table of [`TreeFunc`]s, because
//! transforms may make functions the profile does not have (a collapsed library).
//! Every transform maps each call node as a whole (all samples of a node share its path),
//! so a tree needs only each node's self weight, never the samples themselves.

pub mod diff;
pub mod lines;
pub mod transform;

use std::collections::HashMap;

use crate::profile::{index_type, CodeKind, FuncIndex, Profile, TimeView};

pub use transform::{parse_path, Transform};

index_type!(
    /// Index into [`CallTree::nodes`]. Valid only for the tree it came from: transforms
    /// build new trees, which is why users name nodes by CallNodePath instead.
    CallNodeIndex
);
index_type!(
    /// Index into [`CallTree::funcs`].
    TreeFuncIndex
);

/// A function as the call tree shows it: one of the profile's funcs, or one a transform
/// made (a collapsed library has no profile func).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TreeFunc {
    pub name: String,
    /// The library's name, when the function is in one.
    pub lib: Option<String>,
    pub kind: CodeKind,
    /// The profile func this is, if any.
    pub profile_func: Option<FuncIndex>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallNode {
    pub func: TreeFuncIndex,
    pub parent: Option<CallNodeIndex>,
    /// Children with weight, heaviest first, then by name.
    pub children: Vec<CallNodeIndex>,
    /// Weight of the samples whose leaf is this node.
    pub self_weight: u64,
    /// Self weight of this node and all its descendants.
    pub running_weight: u64,
    /// Every frame behind this node was inlined into its caller by the compiler.
    pub inlined: bool,
}

/// A call tree. Invariants: a node's parent comes before it in `nodes`; no two nodes
/// share (parent, func); `roots` and every `children` list hold only nodes with running
/// weight, sorted heaviest first.
#[derive(Clone, Debug, Default)]
pub struct CallTree {
    pub funcs: Vec<TreeFunc>,
    pub nodes: Vec<CallNode>,
    pub roots: Vec<CallNodeIndex>,
    /// True for a bottom-up tree ([`CallTree::inverted`]): roots are the functions that
    /// ran, children their callers, and only roots have self weight.
    pub inverted: bool,
}

/// Builds a tree node by node: interns (parent, func) pairs and collects self weights.
/// Running weights, child lists and sorting are made by [`TreeBuilder::finish`].
#[derive(Default)]
struct TreeBuilder {
    funcs: Vec<TreeFunc>,
    nodes: Vec<CallNode>,
    by_key: HashMap<(Option<CallNodeIndex>, TreeFuncIndex), CallNodeIndex>,
}

impl TreeBuilder {
    fn node(
        &mut self,
        parent: Option<CallNodeIndex>,
        func: TreeFuncIndex,
        inlined: bool,
    ) -> CallNodeIndex {
        if let Some(&id) = self.by_key.get(&(parent, func)) {
            let n = &mut self.nodes[id.index()];
            n.inlined &= inlined;
            return id;
        }
        let id = CallNodeIndex::new(self.nodes.len());
        self.nodes.push(CallNode {
            func,
            parent,
            children: Vec::new(),
            self_weight: 0,
            running_weight: 0,
            inlined,
        });
        self.by_key.insert((parent, func), id);
        id
    }

    /// Completes the tree. Running weights are summed from self weights (children come
    /// after their parents), except for a bottom-up tree, whose running weights the
    /// caller counted (`inverted_running`, one per node).
    fn finish(mut self, inverted_running: Option<Vec<u64>>) -> CallTree {
        let inverted = inverted_running.is_some();
        match inverted_running {
            Some(running) => {
                for (n, r) in self.nodes.iter_mut().zip(running) {
                    n.running_weight = r;
                }
            }
            None => {
                for i in (0..self.nodes.len()).rev() {
                    let n = &mut self.nodes[i];
                    n.running_weight += n.self_weight;
                    let (running, parent) = (n.running_weight, n.parent);
                    if let Some(p) = parent {
                        self.nodes[p.index()].running_weight += running;
                    }
                }
            }
        }
        let mut roots = Vec::new();
        for i in 0..self.nodes.len() {
            if self.nodes[i].running_weight == 0 {
                continue;
            }
            let id = CallNodeIndex::new(i);
            match self.nodes[i].parent {
                Some(p) => self.nodes[p.index()].children.push(id),
                None => roots.push(id),
            }
        }
        let mut tree = CallTree {
            funcs: self.funcs,
            nodes: self.nodes,
            roots,
            inverted,
        };
        let roots = std::mem::take(&mut tree.roots);
        tree.roots = tree.sorted(roots);
        for i in 0..tree.nodes.len() {
            let kids = std::mem::take(&mut tree.nodes[i].children);
            tree.nodes[i].children = tree.sorted(kids);
        }
        tree
    }
}

impl CallTree {
    /// The call tree of the samples of the threads `threads` (indexes into
    /// `profile.threads`) merged together, weighed as `view` says.
    pub fn build(profile: &Profile, threads: &[usize], view: TimeView) -> CallTree {
        let interval_ns = profile.meta.interval_ns();
        let mut b = TreeBuilder {
            funcs: profile
                .funcs
                .iter()
                .enumerate()
                .map(|(i, f)| TreeFunc {
                    name: f.name.clone(),
                    lib: f.lib.map(|l| profile.libs[l.index()].name.clone()),
                    kind: CodeKind::User,
                    profile_func: Some(FuncIndex::new(i)),
                })
                .collect(),
            ..TreeBuilder::default()
        };
        for frame in &profile.frames {
            b.funcs[frame.func.index()].kind = frame.kind;
        }
        // Stacks come after their prefixes, so one forward pass maps every stack.
        let mut stack_node: Vec<CallNodeIndex> = Vec::with_capacity(profile.stacks.len());
        for stack in &profile.stacks {
            let parent = stack.prefix.map(|p| stack_node[p.index()]);
            let frame = &profile.frames[stack.frame.index()];
            let func = TreeFuncIndex::new(frame.func.index());
            stack_node.push(b.node(parent, func, frame.inline_depth > 0));
        }
        for &t in threads {
            for s in &profile.threads[t].samples {
                let node = stack_node[s.stack.index()];
                b.nodes[node.index()].self_weight += view.weight(s.weight, interval_ns);
            }
        }
        b.finish(None)
    }

    /// The call tree of every thread merged, in the profile's default view (see
    /// [`TimeView::default_for`]).
    pub fn all_threads(profile: &Profile) -> CallTree {
        CallTree::all_threads_in(profile, TimeView::default_for(&profile.meta))
    }

    /// The call tree of every thread merged, weighed as `view` says.
    pub fn all_threads_in(profile: &Profile, view: TimeView) -> CallTree {
        let threads: Vec<usize> = (0..profile.threads.len()).collect();
        CallTree::build(profile, &threads, view)
    }

    pub fn node(&self, id: CallNodeIndex) -> &CallNode {
        &self.nodes[id.index()]
    }

    pub fn func(&self, id: CallNodeIndex) -> &TreeFunc {
        &self.funcs[self.node(id).func.index()]
    }

    pub fn name(&self, id: CallNodeIndex) -> &str {
        &self.func(id).name
    }

    /// Total weight of the tree.
    pub fn total(&self) -> u64 {
        self.roots
            .iter()
            .map(|&r| self.node(r).running_weight)
            .sum()
    }

    /// The node's CallNodePath: its functions' names, root first.
    pub fn path(&self, id: CallNodeIndex) -> Vec<&str> {
        let mut path = Vec::new();
        let mut at = Some(id);
        while let Some(n) = at {
            path.push(self.name(n));
            at = self.node(n).parent;
        }
        path.reverse();
        path
    }

    /// The node named by a CallNodePath of function names, root first (see
    /// [`transform::name_matches`] for how a name matches).
    pub fn find_path(&self, path: &[&str]) -> Option<CallNodeIndex> {
        let mut candidates = &self.roots;
        let mut found = None;
        for name in path {
            let next = candidates
                .iter()
                .copied()
                .find(|&c| transform::name_matches(self.name(c), name))?;
            found = Some(next);
            candidates = &self.node(next).children;
        }
        found
    }

    /// Nodes sorted for display: heaviest first, then by name.
    fn sorted(&self, mut nodes: Vec<CallNodeIndex>) -> Vec<CallNodeIndex> {
        nodes.sort_by(|&a, &b| {
            let (na, nb) = (self.node(a), self.node(b));
            nb.running_weight
                .cmp(&na.running_weight)
                .then_with(|| self.name(a).cmp(self.name(b)))
        });
        nodes
    }

    /// The bottom-up tree: its roots are the functions that were running (with their
    /// self weight as both running and self weight), their children the callers, up to
    /// the outermost function. Running weight of a deeper node is the part of the root's
    /// self weight that went through that chain of callers.
    pub fn inverted(&self) -> CallTree {
        let mut b = TreeBuilder {
            funcs: self.funcs.clone(),
            ..TreeBuilder::default()
        };
        // Self weight goes to the inverted root only; every node on the path carries the
        // root's self weight as running weight.
        let mut running: Vec<u64> = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.self_weight == 0 {
                continue;
            }
            let mut parent = None;
            let mut at = Some(CallNodeIndex::new(i));
            while let Some(id) = at {
                let old = self.node(id);
                let node = b.node(parent, old.func, old.inlined);
                if running.len() <= node.index() {
                    running.resize(node.index() + 1, 0);
                }
                running[node.index()] += n.self_weight;
                if parent.is_none() {
                    b.nodes[node.index()].self_weight += n.self_weight;
                }
                parent = Some(node);
                at = old.parent;
            }
        }
        running.resize(b.nodes.len(), 0);
        b.finish(Some(running))
    }

    /// Self weight per function name, over the whole tree (for a bottom-up tree, the
    /// roots' weights). The figure every output format must agree on.
    pub fn self_by_function(&self) -> HashMap<String, u64> {
        let mut out: HashMap<String, u64> = HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.self_weight > 0 {
                *out.entry(self.name(CallNodeIndex::new(i)).to_string())
                    .or_default() += n.self_weight;
            }
        }
        out
    }

    /// The tree in the one-line notation of docs/design.md §3:
    /// `A:3,0 > B:3,0 > { C:2,0 > … ; H:1,0 > F:1,1 }` (name:running,self).
    pub fn to_compact_string(&self) -> String {
        self.compact_list(&self.roots)
    }

    fn compact_list(&self, nodes: &[CallNodeIndex]) -> String {
        match nodes {
            [] => String::new(),
            [one] => self.compact_node(*one),
            many => {
                let parts: Vec<String> = many.iter().map(|&n| self.compact_node(n)).collect();
                format!("{{ {} }}", parts.join(" ; "))
            }
        }
    }

    fn compact_node(&self, id: CallNodeIndex) -> String {
        let n = self.node(id);
        let head = format!("{}:{},{}", self.name(id), n.running_weight, n.self_weight);
        if n.children.is_empty() {
            head
        } else {
            format!("{head} > {}", self.compact_list(&n.children))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn seed_001() -> Profile {
        Profile::from_named_stacks(&[
            &["A", "B", "C", "D", "E"],
            &["A", "B", "C", "F", "G"],
            &["A", "B", "H", "F"],
        ])
    }

    #[test]
    fn seed_001_call_tree() {
        let tree = CallTree::all_threads(&seed_001());
        assert_eq!(
            tree.to_compact_string(),
            "A:3,0 > B:3,0 > { C:2,0 > { D:1,0 > E:1,1 ; F:1,0 > G:1,1 } ; H:1,0 > F:1,1 }"
        );
        assert_eq!(tree.total(), 3);
        let c = tree.find_path(&["A", "B", "C"]).unwrap();
        assert_eq!(tree.node(c).running_weight, 2);
        assert_eq!(tree.path(c), ["A", "B", "C"]);
        assert!(tree.find_path(&["A", "C"]).is_none());
    }

    #[test]
    fn seed_001_inverted() {
        let tree = CallTree::all_threads(&seed_001()).inverted();
        assert_eq!(
            tree.to_compact_string(),
            "{ E:1,1 > D:1,0 > C:1,0 > B:1,0 > A:1,0 ; \
             F:1,1 > H:1,0 > B:1,0 > A:1,0 ; \
             G:1,1 > F:1,0 > C:1,0 > B:1,0 > A:1,0 }"
        );
        assert_eq!(tree.total(), 3);
        let by_func = tree.self_by_function();
        assert_eq!(by_func.len(), 3);
        assert!(by_func.values().all(|&w| w == 1));
    }

    #[test]
    fn inverted_sums_callers_of_one_function() {
        let p = Profile::from_named_stacks(&[
            &["main", "a", "hot"],
            &["main", "b", "hot"],
            &["main", "b", "hot"],
            &["main", "hot"],
            &["main"],
        ]);
        let tree = CallTree::all_threads(&p).inverted();
        assert_eq!(
            tree.to_compact_string(),
            "{ hot:4,4 > { b:2,0 > main:2,0 ; a:1,0 > main:1,0 ; main:1,0 } ; main:1,1 }"
        );
    }
}
