//! Call tree transforms (docs/design.md §3, seed 001): each takes a tree and returns a new one,
//! so they stack and are applied in the order given. Nodes are named by CallNodePath
//! (function names from the root), never by index, since indexes change with every
//! transform.
//!
//! Every transform decides a `Fate` for each node of the old tree; one forward pass
//! (parents come first) then places each node in the new tree and moves its self weight
//! there.

use super::{CallNodeIndex, CallTree, TreeBuilder, TreeFunc, TreeFuncIndex};
use crate::profile::CodeKind;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transform {
    /// Merge function F: every call node of F disappears, its children move up to its
    /// parent and its self time goes to the parent ("charge to caller").
    MergeFunction(String),
    /// Merge call node: the one node named by the path disappears, as above.
    MergeCallNode(Vec<String>),
    /// Merge subtree (prune): the node and everything below disappear; their time becomes
    /// the parent's self time.
    PruneCallNode(Vec<String>),
    /// Drop function (hide): samples whose stack contains F are removed.
    DropFunction(String),
    /// Focus subtree: only samples through the node, with the node as the root.
    FocusSubtree(Vec<String>),
    /// Focus function: every call of F becomes a root (the outermost one where F
    /// recurses); samples that never reach F are removed.
    FocusFunction(String),
    /// Collapse library: consecutive frames of the library become one node named after it.
    CollapseLibrary(String),
    /// Collapse direct recursion: F calling F directly shows as one F.
    CollapseRecursion(String),
    /// Collapse indirect recursion: a call of F made while F is already on the stack
    /// (through any functions) is merged into its caller.
    CollapseIndirectRecursion(String),
}

/// Where a node of the old tree goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Under its parent's new place, with its own function.
    Keep,
    /// A root of the new tree, with its own function.
    KeepAsRoot,
    /// Into its parent's new place: it disappears, its self weight goes to the parent.
    Merge,
    /// Away, with all its descendants and their samples.
    Drop,
    /// Under its parent's new place, as this other function.
    Rename(TreeFuncIndex),
    /// Above the new roots: its own samples are removed, its children become roots.
    Hide,
}

/// Where an old node ended up in the new tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Dropped,
    /// At this node, or above the roots when `None`.
    At(Option<CallNodeIndex>),
}

/// Whether a function's `name` is what a user means by `query`: the same, or the same
/// but for a parameter list (`hash` matches `hash(void const*, unsigned long)`).
pub fn name_matches(name: &str, query: &str) -> bool {
    name == query
        || name
            .strip_prefix(query)
            .is_some_and(|rest| rest.starts_with('('))
}

/// Splits a CallNodePath `A>B>C` (spaces around `>` allowed) into function names. A `>`
/// inside template or generic brackets (`Vec<u8>::push`) does not split.
pub fn parse_path(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            '>' => {
                parts.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current.trim().to_string());
    parts
}

impl std::fmt::Display for Transform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = |p: &[String]| p.join(" > ");
        match self {
            Transform::MergeFunction(n) => write!(f, "merge function {n}"),
            Transform::MergeCallNode(p) => write!(f, "merge node {}", path(p)),
            Transform::PruneCallNode(p) => write!(f, "prune {}", path(p)),
            Transform::DropFunction(n) => write!(f, "drop function {n}"),
            Transform::FocusSubtree(p) => write!(f, "focus on {}", path(p)),
            Transform::FocusFunction(n) => write!(f, "focus on function {n}"),
            Transform::CollapseLibrary(l) => write!(f, "collapse library {l}"),
            Transform::CollapseRecursion(n) => write!(f, "collapse recursion of {n}"),
            Transform::CollapseIndirectRecursion(n) => {
                write!(f, "collapse indirect recursion of {n}")
            }
        }
    }
}

impl Transform {
    /// The transformed tree, or why the transform names nothing in this tree: the
    /// transform decides each node's fate (a collapse may add the function it collapses
    /// into), then one forward pass builds the new tree.
    pub fn apply(&self, tree: &CallTree) -> Result<CallTree, String> {
        if tree.inverted {
            return Err("transforms apply to the top-down tree, before inverting".into());
        }
        let mut funcs = tree.funcs.clone();
        let keep_or = |matched: bool, fate: Fate| if matched { fate } else { Fate::Keep };
        let fates: Vec<Fate> = match self {
            Transform::MergeFunction(name) => {
                let is_f = function_nodes(tree, name)?;
                each_node(tree, |i| keep_or(is_f[i], Fate::Merge))
            }
            Transform::MergeCallNode(path) => {
                let m = PathMatch::new(tree, path)?;
                each_node(tree, |i| keep_or(m.exact(i), Fate::Merge))
            }
            Transform::PruneCallNode(path) => {
                let m = PathMatch::new(tree, path)?;
                each_node(tree, |i| keep_or(m.inside[i], Fate::Merge))
            }
            Transform::DropFunction(name) => {
                let on_path = on_path(tree, &function_nodes(tree, name)?);
                each_node(tree, |i| keep_or(on_path[i], Fate::Drop))
            }
            Transform::FocusSubtree(path) => focus_subtree(tree, &PathMatch::new(tree, path)?),
            Transform::FocusFunction(name) => focus_function(tree, &function_nodes(tree, name)?),
            Transform::CollapseLibrary(lib) => collapse_library(tree, lib, &mut funcs)?,
            Transform::CollapseRecursion(name) => {
                let is_f = function_nodes(tree, name)?;
                each_node(tree, |i| {
                    keep_or(is_f[i] && parent_in(tree, i, &is_f), Fate::Merge)
                })
            }
            Transform::CollapseIndirectRecursion(name) => {
                let is_f = function_nodes(tree, name)?;
                let on_path = on_path(tree, &is_f);
                each_node(tree, |i| {
                    keep_or(is_f[i] && parent_in(tree, i, &on_path), Fate::Merge)
                })
            }
        };
        Ok(remap(tree, funcs, &fates))
    }
}

/// The fate of each node of `tree`, by index.
fn each_node(tree: &CallTree, fate: impl Fn(usize) -> Fate) -> Vec<Fate> {
    (0..tree.nodes.len()).map(fate).collect()
}

/// Whether node `i` has a parent in `set` (a flag per node).
fn parent_in(tree: &CallTree, i: usize, set: &[bool]) -> bool {
    tree.nodes[i].parent.is_some_and(|p| set[p.index()])
}

/// Focus subtree: the outermost node the path names becomes a root with everything
/// below it; the nodes on the way to it are hidden, all others dropped.
fn focus_subtree(tree: &CallTree, m: &PathMatch) -> Vec<Fate> {
    each_node(tree, |i| {
        let parent_inside = parent_in(tree, i, &m.inside);
        if m.exact(i) && !parent_inside {
            Fate::KeepAsRoot
        } else if parent_inside {
            Fate::Keep
        } else if m.matched[i].is_some() {
            Fate::Hide
        } else {
            Fate::Drop
        }
    })
}

/// Focus function: each outermost call of F (`is_f`) becomes a root with everything
/// below it; the rest is hidden.
fn focus_function(tree: &CallTree, is_f: &[bool]) -> Vec<Fate> {
    let on_path = on_path(tree, is_f);
    each_node(tree, |i| {
        if parent_in(tree, i, &on_path) {
            Fate::Keep
        } else if is_f[i] {
            Fate::KeepAsRoot
        } else {
            Fate::Hide
        }
    })
}

/// Collapse library: the outermost of each run of the library's nodes is renamed to a
/// new function named after the library (added to `funcs`), the rest of the run merged
/// into it.
fn collapse_library(
    tree: &CallTree,
    lib: &str,
    funcs: &mut Vec<TreeFunc>,
) -> Result<Vec<Fate>, String> {
    let in_lib: Vec<bool> = tree
        .nodes
        .iter()
        .map(|n| tree.funcs[n.func.index()].lib.as_deref() == Some(lib))
        .collect();
    if !in_lib
        .iter()
        .zip(&tree.nodes)
        .any(|(&l, n)| l && n.running_weight > 0)
    {
        return Err(format!(
            "no sampled function is in a library named {lib}{}",
            suggest(tree.funcs.iter().filter_map(|f| f.lib.as_deref()), lib)
        ));
    }
    let first = tree.funcs.iter().find(|f| f.lib.as_deref() == Some(lib));
    let collapsed = TreeFuncIndex::new(funcs.len());
    funcs.push(TreeFunc {
        name: lib.to_string(),
        lib: Some(lib.to_string()),
        kind: first.map_or(CodeKind::User, |f| f.kind),
        profile_func: None,
    });
    Ok(each_node(tree, |i| {
        match (in_lib[i], parent_in(tree, i, &in_lib)) {
            (true, true) => Fate::Merge,
            (true, false) => Fate::Rename(collapsed),
            (false, _) => Fate::Keep,
        }
    }))
}

/// Applies transforms in order.
pub fn apply_all(tree: CallTree, transforms: &[Transform]) -> Result<CallTree, String> {
    transforms.iter().try_fold(tree, |t, x| {
        x.apply(&t).map_err(|e| format!("cannot {x}: {e}"))
    })
}

/// Builds the new tree from each old node's fate.
fn remap(tree: &CallTree, funcs: Vec<TreeFunc>, fates: &[Fate]) -> CallTree {
    let mut b = TreeBuilder {
        funcs,
        ..TreeBuilder::default()
    };
    let mut places: Vec<Place> = Vec::with_capacity(tree.nodes.len());
    for (n, &fate) in tree.nodes.iter().zip(fates) {
        let parent = match n.parent {
            Some(p) => places[p.index()],
            None => Place::At(None),
        };
        let place = match (parent, fate) {
            (Place::Dropped, _) | (_, Fate::Drop) => Place::Dropped,
            (Place::At(p), Fate::Keep) => Place::At(Some(b.node(p, n.func, n.inlined))),
            (Place::At(p), Fate::Rename(f)) => Place::At(Some(b.node(p, f, false))),
            (Place::At(_), Fate::KeepAsRoot) => Place::At(Some(b.node(None, n.func, n.inlined))),
            (Place::At(p), Fate::Merge) => Place::At(p),
            (Place::At(_), Fate::Hide) => Place::At(None),
        };
        if let Place::At(Some(new)) = place {
            b.nodes[new.index()].self_weight += n.self_weight;
        }
        places.push(place);
    }
    b.finish(None)
}

/// For each node, whether its function is `name`; an error when no sampled node is.
fn function_nodes(tree: &CallTree, name: &str) -> Result<Vec<bool>, String> {
    let is_f: Vec<bool> = tree
        .nodes
        .iter()
        .map(|n| name_matches(&tree.funcs[n.func.index()].name, name))
        .collect();
    if is_f
        .iter()
        .zip(&tree.nodes)
        .any(|(&f, n)| f && n.running_weight > 0)
    {
        Ok(is_f)
    } else {
        Err(format!(
            "no function named {name} in the call tree{}",
            suggest(
                tree.nodes
                    .iter()
                    .filter(|n| n.running_weight > 0)
                    .map(|n| tree.funcs[n.func.index()].name.as_str()),
                name
            )
        ))
    }
}

/// For each node, whether it or one of its ancestors is marked.
fn on_path(tree: &CallTree, marked: &[bool]) -> Vec<bool> {
    let mut out: Vec<bool> = Vec::with_capacity(tree.nodes.len());
    for (i, n) in tree.nodes.iter().enumerate() {
        let above = n.parent.is_some_and(|p| out[p.index()]);
        out.push(marked[i] || above);
    }
    out
}

/// Which nodes a CallNodePath names.
struct PathMatch {
    len: usize,
    /// `Some(k)`: the node's path is the first `k` names of the path.
    matched: Vec<Option<usize>>,
    /// The node is the named node or below it.
    inside: Vec<bool>,
}

impl PathMatch {
    fn new(tree: &CallTree, path: &[String]) -> Result<PathMatch, String> {
        if path.is_empty() || path.iter().any(String::is_empty) {
            return Err(format!(
                "{:?} is not a call node path (write it as A>B>C, from the root)",
                path.join(">")
            ));
        }
        let len = path.len();
        let mut matched: Vec<Option<usize>> = Vec::with_capacity(tree.nodes.len());
        let mut inside: Vec<bool> = Vec::with_capacity(tree.nodes.len());
        for n in &tree.nodes {
            let depth = match n.parent {
                None => Some(0),
                Some(p) => matched[p.index()],
            };
            let m = depth
                .filter(|&k| k < len && name_matches(&tree.funcs[n.func.index()].name, &path[k]))
                .map(|k| k + 1);
            let parent_inside = n.parent.is_some_and(|p| inside[p.index()]);
            inside.push(m == Some(len) || parent_inside);
            matched.push(m);
        }
        let found = PathMatch {
            len,
            matched,
            inside,
        };
        if (0..tree.nodes.len()).any(|i| found.exact(i) && tree.nodes[i].running_weight > 0) {
            return Ok(found);
        }
        // Say how far the path got, and what is there instead.
        let (mut candidates, mut depth) = (&tree.roots, 0);
        while depth < len {
            match candidates
                .iter()
                .find(|&&c| name_matches(tree.name(c), &path[depth]))
            {
                Some(&c) => {
                    candidates = &tree.node(c).children;
                    depth += 1;
                }
                None => break,
            }
        }
        let there: Vec<&str> = candidates.iter().take(5).map(|&c| tree.name(c)).collect();
        let there = if there.is_empty() {
            "nothing".to_string()
        } else {
            there.join(", ")
        };
        Err(if depth == 0 {
            format!("no call node {} (the roots are {there})", path.join(" > "))
        } else {
            format!(
                "no call node {} (under {} there is {there})",
                path.join(" > "),
                path[..depth].join(" > ")
            )
        })
    }

    fn exact(&self, i: usize) -> bool {
        self.matched[i] == Some(self.len)
    }
}

/// ` (did you mean …?)` with up to three names that contain `query`, or nothing.
fn suggest<'a>(names: impl Iterator<Item = &'a str>, query: &str) -> String {
    let lower = query.to_lowercase();
    let mut found: Vec<&str> = names
        .filter(|n| n.to_lowercase().contains(&lower))
        .collect();
    found.sort_unstable();
    found.dedup();
    if found.is_empty() {
        String::new()
    } else {
        found.truncate(3);
        format!(" (did you mean {}?)", found.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calltree::tests::seed_001;
    use crate::profile::Profile;

    fn path(p: &str) -> Vec<String> {
        parse_path(p)
    }

    fn apply(profile: &Profile, transforms: &[Transform]) -> String {
        apply_all(CallTree::all_threads(profile), transforms)
            .unwrap()
            .to_compact_string()
    }

    #[test]
    fn seed_001_merge_call_node() {
        assert_eq!(
            apply(&seed_001(), &[Transform::MergeCallNode(path("A>B>C"))]),
            "A:3,0 > B:3,0 > { D:1,0 > E:1,1 ; F:1,0 > G:1,1 ; H:1,0 > F:1,1 }"
        );
    }

    #[test]
    fn seed_001_merge_function() {
        assert_eq!(
            apply(&seed_001(), &[Transform::MergeFunction("E".into())]),
            "A:3,0 > B:3,0 > { C:2,0 > { D:1,1 ; F:1,0 > G:1,1 } ; H:1,0 > F:1,1 }"
        );
    }

    #[test]
    fn seed_001_merge_subtree() {
        assert_eq!(
            apply(&seed_001(), &[Transform::PruneCallNode(path("A>B>C"))]),
            "A:3,0 > B:3,2 > H:1,0 > F:1,1"
        );
    }

    #[test]
    fn seed_001_drop_function() {
        assert_eq!(
            apply(&seed_001(), &[Transform::DropFunction("C".into())]),
            "A:1,0 > B:1,0 > H:1,0 > F:1,1"
        );
    }

    #[test]
    fn seed_001_focus_subtree() {
        assert_eq!(
            apply(&seed_001(), &[Transform::FocusSubtree(path("A>B>C"))]),
            "C:2,0 > { D:1,0 > E:1,1 ; F:1,0 > G:1,1 }"
        );
    }

    #[test]
    fn seed_001_focus_function() {
        // Both calls of F become one root; the sample that never reaches F is gone.
        assert_eq!(
            apply(&seed_001(), &[Transform::FocusFunction("F".into())]),
            "F:2,1 > G:1,1"
        );
    }

    #[test]
    fn merging_a_function_everywhere_merges_each_call_node() {
        // F is called at two places; both nodes go, G moves up to C.
        assert_eq!(
            apply(&seed_001(), &[Transform::MergeFunction("F".into())]),
            "A:3,0 > B:3,0 > { C:2,0 > { D:1,0 > E:1,1 ; G:1,1 } ; H:1,1 }"
        );
    }

    #[test]
    fn transforms_stack_in_order() {
        let p = seed_001();
        // Merge C, then F's call nodes are siblings of D under B; drop D's subtree next.
        assert_eq!(
            apply(
                &p,
                &[
                    Transform::MergeCallNode(path("A>B>C")),
                    Transform::DropFunction("D".into()),
                ]
            ),
            "A:2,0 > B:2,0 > { F:1,0 > G:1,1 ; H:1,0 > F:1,1 }"
        );
        // Focus on B, then the path of C is B>C (paths name the transformed tree).
        assert_eq!(
            apply(
                &p,
                &[
                    Transform::FocusSubtree(path("A>B")),
                    Transform::PruneCallNode(path("B>C")),
                    Transform::MergeFunction("H".into()),
                ]
            ),
            "B:3,2 > F:1,1"
        );
        // Order matters: merging B first leaves no A>B>C to focus on.
        let err = apply_all(
            CallTree::all_threads(&p),
            &[
                Transform::MergeFunction("B".into()),
                Transform::FocusSubtree(path("A>B>C")),
            ],
        )
        .unwrap_err();
        assert!(err.contains("no call node A > B > C"), "{err}");
        assert_eq!(
            apply(
                &p,
                &[
                    Transform::MergeFunction("B".into()),
                    Transform::FocusSubtree(path("A>C")),
                    Transform::FocusFunction("F".into()),
                ]
            ),
            "F:1,0 > G:1,1"
        );
    }

    #[test]
    fn collapse_recursion_direct_and_indirect() {
        let p = Profile::from_named_stacks(&[
            &["main", "f", "f", "f", "leaf"],
            &["main", "f", "f"],
            &["main", "f", "g", "f", "leaf"],
        ]);
        assert_eq!(
            apply(&p, &[Transform::CollapseRecursion("f".into())]),
            "main:3,0 > f:3,1 > { g:1,0 > f:1,0 > leaf:1,1 ; leaf:1,1 }"
        );
        assert_eq!(
            apply(&p, &[Transform::CollapseIndirectRecursion("f".into())]),
            "main:3,0 > f:3,1 > { g:1,0 > leaf:1,1 ; leaf:1,1 }"
        );
    }

    #[test]
    fn collapse_library_makes_one_node_per_run_of_frames() {
        let mut p = Profile::from_named_stacks(&[
            &["main", "qsort", "msort", "cmp"],
            &["main", "qsort", "msort", "msort"],
            &["main", "memcpy"],
        ]);
        p.libs.push(crate::profile::Lib {
            name: "libc.so.6".into(),
            path: "/lib/libc.so.6".into(),
            build_id: None,
            kind: crate::profile::LibKind::File,
            base: 0,
        });
        for f in &mut p.funcs {
            if ["qsort", "msort", "memcpy"].contains(&f.name.as_str()) {
                f.lib = Some(crate::profile::LibIndex(0));
            }
        }
        assert_eq!(
            apply(&p, &[Transform::CollapseLibrary("libc.so.6".into())]),
            "main:3,0 > libc.so.6:3,2 > cmp:1,1"
        );
        let err = Transform::CollapseLibrary("libm.so.6".into())
            .apply(&CallTree::all_threads(&p))
            .unwrap_err();
        assert!(err.contains("no sampled function is in a library named libm.so.6"));
    }

    #[test]
    fn unknown_names_are_errors_with_suggestions() {
        let tree = CallTree::all_threads(&seed_001());
        let err = Transform::MergeFunction("Q".into())
            .apply(&tree)
            .unwrap_err();
        assert_eq!(err, "no function named Q in the call tree");
        let p = Profile::from_named_stacks(&[&["main", "hot_a"], &["main", "hot_b"]]);
        let err = Transform::DropFunction("hot".into())
            .apply(&CallTree::all_threads(&p))
            .unwrap_err();
        assert_eq!(
            err,
            "no function named hot in the call tree (did you mean hot_a, hot_b?)"
        );
        let err = Transform::FocusSubtree(path("A>C"))
            .apply(&tree)
            .unwrap_err();
        assert_eq!(err, "no call node A > C (under A there is B)");
        let err = Transform::FocusSubtree(path("B>C"))
            .apply(&tree)
            .unwrap_err();
        assert_eq!(err, "no call node B > C (the roots are A)");
    }

    #[test]
    fn paths_and_names() {
        assert_eq!(parse_path("A>B>C"), ["A", "B", "C"]);
        assert_eq!(
            parse_path(" main > outer >hot_a "),
            ["main", "outer", "hot_a"]
        );
        assert_eq!(
            parse_path("main>std::vector<std::pair<int, int>>::push_back>f"),
            ["main", "std::vector<std::pair<int, int>>::push_back", "f"]
        );
        assert!(name_matches("hash(void const*, unsigned long)", "hash"));
        assert!(!name_matches("hash_bytes", "hash"));
        let p = Profile::from_named_stacks(&[&["main(int, char**)", "f"]]);
        assert_eq!(
            apply(&p, &[Transform::MergeCallNode(path("main>f"))]),
            "main(int, char**):1,1"
        );
    }
}
