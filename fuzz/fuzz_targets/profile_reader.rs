//! The profile reader on any bytes, and everything that runs on what it accepts: call
//! trees, a transform, the report, every export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::calltree::{CallTree, Transform};
use sampler::emit;

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = emit::load::from_slice(data) else {
        return;
    };
    let tree = CallTree::all_threads(&profile);
    let opts = emit::report::ReportOptions {
        width: Some(100),
        color: false,
        max_depth: None,
        min_percent: 0.0,
    };
    let mut text = String::new();
    emit::report::render_tree(&tree.inverted(), &opts, &mut text);
    let merged = sampler::calltree::transform::apply_all(
        CallTree::all_threads(&profile),
        &[Transform::MergeFunction("main".into())],
    );
    if let Ok(tree) = merged {
        emit::report::render_tree(&tree, &opts, &mut text);
    }
    let _ = emit::folded::to_folded(&profile, true);
    let _ = emit::speedscope::to_json(&profile);
    let _ = emit::pprof::to_pprof(&profile);
    let _ = emit::svg::to_svg(&profile, true);
    let _ = emit::firefox::to_json(&profile);
});
