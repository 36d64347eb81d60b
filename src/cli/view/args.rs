//! The command line of `sampler view` and of `record --view`: clap's types, and the
//! check of `--view`'s options before anything is recorded.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::cli::{output_choice, RecordArgs};
use crate::emit;

/// `--profiler-url`'s help (a doc comment would make its address a bare link).
const PROFILER_URL_HELP: &str = "The Firefox Profiler to open [default: $SAMPLER_PROFILER_URL, \
else https://profiler.firefox.com]";

/// How `view` and `record --view` serve and show a profile.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// Print the viewer's URL only; do not open a browser.
    #[arg(long = "no-open")]
    pub no_open: bool,
    #[arg(long = "profiler-url", value_name = "URL", help = PROFILER_URL_HELP)]
    pub profiler_url: Option<String>,
    /// The port on 127.0.0.1 to serve the profile from [default: a free one].
    #[arg(long = "port", value_name = "N")]
    pub port: Option<u16>,
    /// Stop once the viewer has fetched the profile(s), instead of at Ctrl-C (for
    /// scripts).
    #[arg(long = "exit-after-fetch")]
    pub exit_after_fetch: bool,
}

impl ServeArgs {
    /// The checked options.
    pub fn options(&self) -> Result<super::ViewOptions> {
        Ok(super::ViewOptions {
            open: !self.no_open,
            profiler_url: super::profiler_url(self.profiler_url.as_deref())?,
            port: self.port.unwrap_or(0),
            exit_after_fetch: self.exit_after_fetch,
        })
    }

    fn any_given(&self) -> bool {
        self.no_open || self.profiler_url.is_some() || self.port.is_some() || self.exit_after_fetch
    }
}

#[derive(clap::Args)]
pub struct ViewArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// A profile sampler wrote: Firefox (.json, .json.gz), or folded, speedscope or
    /// pprof, which are converted.
    pub file: PathBuf,
    /// A second profile: the viewer compares the two.
    pub file2: Option<PathBuf>,
}

impl RecordArgs {
    /// `--view`'s options, checked before anything is recorded: `None` without
    /// `--view`, whose options alone are a mistake, as is `--view` of an SVG flame graph.
    pub fn view_options(&self) -> Result<Option<super::ViewOptions>> {
        if !self.view {
            if self.serve.any_given() {
                bail!("--no-open, --profiler-url, --port and --exit-after-fetch go with --view");
            }
            return Ok(None);
        }
        let (format, _) = output_choice(self.format, self.output.clone())?;
        if format == emit::Format::Svg {
            bail!(
                "--view opens the profile in the Firefox Profiler; an SVG flame graph keeps no samples to show there (leave out -f, or write .json.gz)"
            );
        }
        self.serve.options().map(Some)
    }
}
