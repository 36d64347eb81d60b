//! `sampler diff BASE NEW`: reads the two profiles, compares them
//! ([`crate::calltree::diff`]) and prints the comparison, or writes the differential
//! flame graph ([`crate::emit::diff`]).

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};

use crate::calltree::diff::{compare, FunctionWeights};
use crate::cli::{DiffArgs, DiffFormatArg, TimeArg};
use crate::emit;
use crate::files::output;
use crate::profile::TimeView;

/// `sampler diff BASE NEW`: the comparison as a table or JSON on stdout, or a
/// differential flame graph written to `-o`.
pub fn diff(args: DiffArgs) -> Result<()> {
    let graph = args.flame_graph()?;
    let to_stdout = graph.as_ref().is_none_or(|(_, o)| o.as_os_str() == "-");
    let tty = to_stdout && std::io::stdout().is_terminal();
    let table = args.table_options(tty)?;
    let sudo = output::SudoUser::from_env();
    if let Some((_, path)) = graph.as_ref().filter(|_| !to_stdout) {
        let root = nix::unistd::Uid::effective().is_root();
        output::check_destination(path, root, sudo)?;
        for input in [&args.base, &args.new] {
            if same_file(path, input) {
                anyhow::bail!(
                    "-o {} is the profile {}: write the flame graph to another file",
                    path.display(),
                    input.display()
                );
            }
        }
    }
    let (mut base, mut new) = (
        emit::load::read_profile(&args.base)?,
        emit::load::read_profile(&args.new)?,
    );
    let both_off_cpu = base.meta.off_cpu && new.meta.off_cpu;
    let view = match args.time.map(TimeArg::view) {
        Some(view) if view != TimeView::Cpu && !both_off_cpu => {
            let lacking = if base.meta.off_cpu {
                &args.new
            } else {
                &args.base
            };
            anyhow::bail!(
                "{} has no off-CPU time (record with --off-cpu); only --time cpu can be compared",
                lacking.display()
            );
        }
        Some(view) => view,
        None if both_off_cpu => TimeView::Wall,
        None => TimeView::Cpu,
    };
    if tty {
        emit::escape_for_terminal(&mut base);
        emit::escape_for_terminal(&mut new);
    }
    let (base_weights, new_weights) = (
        FunctionWeights::of(&base, view, args.user),
        FunctionWeights::of(&new, view, args.user),
    );
    for (weights, path) in [(&base_weights, &args.base), (&new_weights, &args.new)] {
        if weights.total == 0 {
            anyhow::bail!(
                "{} has no samples ({}): there is nothing to compare",
                path.display(),
                view.name()
            );
        }
    }
    let name = |p: &std::path::Path| p.display().to_string();
    let text = match &graph {
        Some((DiffFormatArg::Folded, _)) => emit::diff::diff_folded(&base, &new, view),
        Some((DiffFormatArg::Svg, _)) => {
            emit::diff::diff_svg(&base, &new, view, &name(&args.base), &name(&args.new))
        }
        None => {
            let comparison = compare(&base_weights, &new_weights);
            match args.json {
                true => format!("{:#}\n", emit::diff::to_json(&comparison)),
                false => emit::diff::render_table(
                    &comparison,
                    &name(&args.base),
                    &name(&args.new),
                    &table,
                ),
            }
        }
    };
    match graph {
        Some((_, path)) if !to_stdout => {
            let mut file = output::AtomicFile::create(&path)?;
            file.write_all(text.as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
            file.commit(sudo)?;
            crate::say!("sampler: wrote {}", path.display());
            Ok(())
        }
        _ => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => other.context("cannot write the comparison to standard output"),
            }
        }
    }
}

/// Whether two names are one file (device and inode), however each is spelled.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}
