//! `--otlp` and `--push`, which `record` and `convert` share: where a profile is sent
//! once it is written (see [`crate::emit::push`]).

use anyhow::Result;

use crate::emit::push::{self, Destination};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct PushArgs {
    /// Also send the profile as OTLP profiles (OTLP/HTTP, gzipped protobuf) to URL
    /// [default URL: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT
    /// with /v1development/profiles appended, else
    /// http://localhost:4318/v1development/profiles]; headers from
    /// OTEL_EXPORTER_OTLP_HEADERS. The file is written first and kept.
    #[arg(long = "otlp", value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub otlp: Option<String>,
    /// Also POST the profile as gzipped pprof to URL (Pyroscope's
    /// http://HOST:4040/ingest?name=APP&format=pprof, the Collector's pprof receiver).
    /// The file is written first and kept.
    #[arg(long = "push", value_name = "URL")]
    pub push: Option<String>,
}

impl PushArgs {
    /// The checked destinations, in the order `--otlp`, `--push`.
    pub fn destinations(&self) -> Result<Vec<Destination>> {
        let env = |name: &str| std::env::var(name).ok();
        let mut dests = Vec::new();
        if let Some(url) = &self.otlp {
            dests.push(push::otlp_destination(Some(url), &env)?);
        }
        if let Some(url) = &self.push {
            dests.push(push::pprof_destination(url)?);
        }
        Ok(dests)
    }
}
