//! The profile reader on any bytes, and everything that runs on what it accepts: call
//! trees and the report in each time view (on-CPU, off-CPU, wall-clock), a transform,
//! every export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sampler::calltree::{CallTree, Transform};
use sampler::emit;
use sampler::profile::TimeView;

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = emit::firefox::from_slice(data) else {
        return;
    };
    let mut text = String::new();
    let plain = emit::report::ReportOptions {
        width: Some(100),
        color: false,
        max_depth: None,
        min_percent: 0.0,
        time: None,
    };
    for view in [TimeView::Cpu, TimeView::OffCpu, TimeView::Wall] {
        let opts = emit::report::ReportOptions {
            time: Some(view),
            ..plain
        };
        let tree = CallTree::all_threads_in(&profile, view);
        emit::report::render_tree(&tree.inverted(), &opts, &mut text);
        let _ = emit::folded::to_folded(&profile, true, view);
        let _ = emit::speedscope::to_json(&profile, view);
        let _ = emit::svg::to_svg(&profile, true, view);
    }
    let merged = sampler::calltree::transform::apply_all(
        CallTree::all_threads(&profile),
        &[Transform::MergeFunction("main".into())],
    );
    if let Ok(tree) = merged {
        emit::report::render_tree(&tree, &plain, &mut text);
    }
    let _ = emit::pprof::to_pprof(&profile);
    let _ = emit::firefox::to_json(&profile);
});
