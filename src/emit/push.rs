//! Sending a profile to a back end over HTTP, after its file is written: `--otlp` POSTs
//! the OTLP export request ([`super::otlp`]) as OTLP/HTTP does, `--push` the pprof
//! profile (Pyroscope's `/ingest?format=pprof`, the Collector's pprof receiver). Both
//! gzipped. Where `--otlp` sends without a URL, and with which headers, follows the
//! OpenTelemetry SDKs' environment variables.

use std::time::Duration;

use anyhow::{bail, Result};
use prost::Message;

use crate::profile::Profile;

/// Where a profile goes, and in which form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub url: String,
    pub payload: Payload,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// An OTLP `ExportProfilesServiceRequest`.
    Otlp,
    /// A pprof `profile.proto`.
    Pprof,
}

impl Payload {
    /// What it is called in file names.
    pub fn name(self) -> &'static str {
        match self {
            Payload::Otlp => "otlp",
            Payload::Pprof => "pprof",
        }
    }
}

/// The path of the profiles signal that OTLP/HTTP SDKs append to
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (and not to the signal's own variable).
pub const OTLP_PROFILES_PATH: &str = "v1development/profiles";

/// The SDKs' endpoint when no variable names one: the local Collector's OTLP/HTTP port.
pub const DEFAULT_OTLP_BASE: &str = "http://localhost:4318";

/// How long a send may take in all, connecting included: a back end that does not
/// answer in that time is taken as down (the profile stays in its file).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// `--otlp [URL]`'s destination: the URL given, else `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`
/// as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1development/profiles` appended,
/// else `http://localhost:4318/v1development/profiles`; headers from
/// `OTEL_EXPORTER_OTLP_PROFILES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`.
pub fn otlp_destination(
    url: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Destination> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let url = match url.filter(|u| !u.is_empty()) {
        Some(u) => u.to_string(),
        None => match set("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
            Some(u) => u.trim().to_string(),
            None => {
                let base = set("OTEL_EXPORTER_OTLP_ENDPOINT")
                    .unwrap_or_else(|| DEFAULT_OTLP_BASE.to_string());
                format!("{}/{OTLP_PROFILES_PATH}", base.trim().trim_end_matches('/'))
            }
        },
    };
    check_url("--otlp", &url)?;
    let headers = match [
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
        "OTEL_EXPORTER_OTLP_HEADERS",
    ]
    .into_iter()
    .find_map(|name| set(name).map(|v| (name, v)))
    {
        Some((name, value)) => parse_headers(&value).map_err(|e| anyhow::anyhow!("{name}: {e}"))?,
        None => Vec::new(),
    };
    Ok(Destination {
        url,
        payload: Payload::Otlp,
        headers,
    })
}

/// `--push URL`'s destination.
pub fn pprof_destination(url: &str) -> Result<Destination> {
    check_url("--push", url)?;
    Ok(Destination {
        url: url.to_string(),
        payload: Payload::Pprof,
        headers: Vec::new(),
    })
}

fn check_url(option: &str, url: &str) -> Result<()> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) || url.len() < 8 {
        bail!("{option} {url}: give an http:// or https:// URL");
    }
    Ok(())
}

/// The W3C-baggage-like list the SDKs read headers from: `key=value,key2=value2`, values
/// percent-encoded.
fn parse_headers(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{:?} is not key=value", item.trim()))?;
            let key = key.trim();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(format!("{key:?} is not a header name"));
            }
            Ok((key.to_string(), percent_decode(value.trim())?))
        })
        .collect()
}

fn percent_decode(text: &str) -> std::result::Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{text:?} has a % not followed by two hex digits"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8 once decoded"))
}

/// The gzipped body sent to `dest` (`just_recorded`: see [`super::otlp::to_request`]).
pub fn body(profile: &Profile, payload: Payload, just_recorded: bool) -> std::io::Result<Vec<u8>> {
    match payload {
        Payload::Pprof => super::pprof::to_pprof(profile).to_gzipped_bytes(),
        Payload::Otlp => {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&super::otlp::to_request(profile, just_recorded).encode_to_vec())?;
            gz.finish()
        }
    }
}

/// POSTs the profile to `dest`; the error is one phrase (what failed).
pub fn send(
    profile: &Profile,
    dest: &Destination,
    just_recorded: bool,
) -> std::result::Result<(), String> {
    let body = body(profile, dest.payload, just_recorded)
        .map_err(|e| format!("cannot compress it: {e}"))?;
    post(dest, &body).map_err(|e| e.why)
}

/// Why a send failed, and whether sending the same again later may succeed.
#[derive(Debug)]
pub struct SendError {
    /// One phrase: what failed.
    pub why: String,
    /// The back end could not be reached, did not answer in time, or answered that it
    /// is busy or failing (408, 429, 5xx): the same body may be taken later. Otherwise it
    /// refused this body (another 4xx), and would again.
    pub retry: bool,
}

/// POSTs `body` (gzipped, as [`body`] makes it) to `dest`.
pub fn post(dest: &Destination, body: &[u8]) -> std::result::Result<(), SendError> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(SEND_TIMEOUT))
        .user_agent(format!("sampler/{}", env!("CARGO_PKG_VERSION")))
        .tls_config(crate::symbolicate::debuginfod::system_trust())
        .build()
        .new_agent();
    let mut request = agent
        .post(&dest.url)
        .header("Content-Type", "application/x-protobuf")
        .header("Content-Encoding", "gzip");
    for (key, value) in &dest.headers {
        request = request.header(key, value);
    }
    let response = request.send(body).map_err(|e| SendError {
        why: match e {
            ureq::Error::Timeout(_) => format!("no answer within {} s", SEND_TIMEOUT.as_secs()),
            other => other.to_string(),
        },
        retry: true,
    })?;
    let status = response.status();
    if !status.is_success() {
        let mut response = response;
        let text = response
            .body_mut()
            .with_config()
            .limit(ERROR_TEXT_LIMIT)
            .read_to_string()
            .unwrap_or_default();
        let text: String = text
            .chars()
            .filter(|c| !c.is_control())
            .take(ERROR_TEXT_SHOWN)
            .collect();
        let code = status.as_u16();
        return Err(SendError {
            why: format!(
                "it answered {status}{}",
                match text.trim() {
                    "" => String::new(),
                    t => format!(": {t}"),
                }
            ),
            retry: !(400..500).contains(&code) || code == 408 || code == 429,
        });
    }
    Ok(())
}

/// The most of an error answer read (64 KiB), and the characters of it shown (one line).
const ERROR_TEXT_LIMIT: u64 = 64 << 10;
const ERROR_TEXT_SHOWN: usize = 200;

/// Sends the profile to each destination, saying so for each that took it. The error
/// is one line for those that failed, with where the profile is kept (`kept`: its file).
pub fn send_all(
    profile: &Profile,
    dests: &[Destination],
    just_recorded: bool,
    kept: &std::path::Path,
) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    for dest in dests {
        match send(profile, dest, just_recorded) {
            Ok(()) => crate::say!("sampler: sent the profile to {}", dest.url),
            Err(why) => failures.push(format!("{}: {why}", dest.url)),
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    bail!(
        "could not send the profile to {}; the profile is kept in {}",
        failures.join("; to "),
        kept.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_otlp_endpoint_follows_the_sdks_variables() {
        let url = |arg: Option<&str>, vars: &[(&str, &str)]| {
            otlp_destination(arg, &env(vars)).unwrap().url
        };
        assert_eq!(
            url(None, &[]),
            "http://localhost:4318/v1development/profiles"
        );
        assert_eq!(
            url(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]),
            "http://c:4318/v1development/profiles"
        );
        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://p:9/x"),
        ];
        assert_eq!(url(None, &both), "http://p:9/x");
        assert_eq!(url(Some("https://given/p"), &both), "https://given/p");
        assert!(otlp_destination(Some("c:4318"), &env(&[])).is_err());
    }

    #[test]
    fn otlp_headers_are_decoded_and_a_bad_list_is_refused() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
                "Authorization=Basic%20dXNlcjpw , x-scope-orgid=t1",
            ),
        ];
        let headers = otlp_destination(None, &env(&vars)).unwrap().headers;
        assert_eq!(
            headers,
            vec![
                ("Authorization".to_string(), "Basic dXNlcjpw".to_string()),
                ("x-scope-orgid".to_string(), "t1".to_string())
            ]
        );
        let err = otlp_destination(None, &env(&[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("OTEL_EXPORTER_OTLP_HEADERS: "), "{err}");
        assert!(parse_headers("a=%zz").is_err());
    }
}
