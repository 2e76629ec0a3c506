//! What a browser could be made to send: the checks that keep web pages of other sites away
//! from a control API, with or without a token.
//!
//! - `Host` must name this host: an IP address, `localhost`, this machine's name, or a name
//!   the daemon was given (`--allow-host`). A page whose own name was made to resolve to this
//!   host (DNS rebinding) sends its own name and is refused, reads included.
//! - A mutating call (any method but GET and HEAD) that carries an `Origin` must come from the
//!   origin the `Host` names: a page of another site cannot stop an acquisition. Browsers send
//!   `Origin` on every cross-origin POST; scripts and the manager send none and pass.
//! - A mutating call with a body must say `Content-Type: application/json`: the content types
//!   a page may send without asking first (`text/plain`, forms) are refused.

use axum::http::{header, HeaderMap, Method};

/// Why a call was refused, as its one-line answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Foreign {
    /// A `Host` that does not name this host (421 Misdirected Request).
    Host,
    /// A mutating call from a page of another origin (403).
    Origin,
    /// A mutating call whose body is not declared JSON (415).
    ContentType,
}

impl Foreign {
    pub fn why(self) -> &'static str {
        match self {
            Foreign::Host => "the Host header does not name this host (an IP address, localhost, this machine's name, or --allow-host)",
            Foreign::Origin => "a call that changes something must come from this API's own origin, not another site's page",
            Foreign::ContentType => "a call with a body must send it as Content-Type: application/json",
        }
    }
}

/// The names this host answers to, besides IP addresses and `localhost`.
#[derive(Clone, Debug, Default)]
pub struct Names(Vec<String>);

impl Names {
    /// This machine's name (the kernel's) and `extra`, compared without case.
    pub fn of_this_host(extra: &[String]) -> Names {
        let own = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).ok();
        Names(own.into_iter().chain(extra.iter().cloned()).filter(|n| !n.is_empty()).map(|n| n.to_ascii_lowercase()).collect())
    }

    /// Whether a call with `method` and `headers` may go on.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), Foreign> {
        let host = headers.get(header::HOST).map(|h| h.to_str().map_err(|_| Foreign::Host)).transpose()?;
        if let Some(host) = host {
            if !self.names(host) {
                return Err(Foreign::Host);
            }
        }
        if method == Method::GET || method == Method::HEAD {
            return Ok(());
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let own = host.is_some_and(|h| origin.to_str().is_ok_and(|o| o.strip_prefix("http://").is_some_and(|o| o.eq_ignore_ascii_case(h))));
            if !own {
                return Err(Foreign::Origin);
            }
        }
        let has_body = headers.get(header::CONTENT_LENGTH).is_some_and(|l| l.as_bytes() != b"0") || headers.contains_key(header::TRANSFER_ENCODING);
        let json = headers.get(header::CONTENT_TYPE).and_then(|t| t.to_str().ok()).is_some_and(|t| t.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"));
        if has_body && !json {
            return Err(Foreign::ContentType);
        }
        Ok(())
    }

    /// Whether `host` (a `Host` header: a name or address, and maybe a port) names this host.
    fn names(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(v6) => return v6.split_once(']').is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok()),
            None => host.rsplit_once(':').map_or(host, |(n, _)| n),
        };
        name.parse::<std::net::Ipv4Addr>().is_ok() || name.eq_ignore_ascii_case("localhost") || self.0.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.clone(), HeaderValue::from_str(v).unwrap())).collect()
    }

    #[test]
    fn only_names_of_this_host_are_served() {
        let n = Names(vec!["rx-host".into()]);
        for h in ["127.0.0.1:7001", "10.0.0.2", "localhost:7001", "LOCALHOST", "[::1]:7001", "RX-host:80"] {
            assert_eq!(n.check(&Method::GET, &headers(&[(header::HOST, h)])), Ok(()), "{h}");
        }
        for h in ["evil.example:7001", "127.0.0.1.evil.example", "[evil]:1", "rx-host.evil.example"] {
            assert_eq!(n.check(&Method::GET, &headers(&[(header::HOST, h)])), Err(Foreign::Host), "{h}");
        }
        assert_eq!(n.check(&Method::GET, &HeaderMap::new()), Ok(()), "no Host: not a browser");
    }

    #[test]
    fn a_foreign_page_changes_nothing() {
        let n = Names::default();
        let host = (header::HOST, "127.0.0.1:7001");
        let json = (header::CONTENT_TYPE, "application/json; charset=utf-8");
        let body = (header::CONTENT_LENGTH, "2");
        let stop = |h: &[(header::HeaderName, &str)]| n.check(&Method::POST, &headers(h));
        assert_eq!(stop(&[host.clone(), (header::ORIGIN, "http://evil.example"), json.clone(), body.clone()]), Err(Foreign::Origin));
        assert_eq!(stop(&[host.clone(), (header::ORIGIN, "null")]), Err(Foreign::Origin));
        assert_eq!(stop(&[host.clone(), (header::ORIGIN, "http://127.0.0.1:7002")]), Err(Foreign::Origin), "another port is another origin");
        assert_eq!(stop(&[host.clone(), (header::ORIGIN, "http://127.0.0.1:7001"), json.clone(), body.clone()]), Ok(()), "the dashboard's own page");
        assert_eq!(stop(&[host.clone(), (header::CONTENT_TYPE, "text/plain"), body.clone()]), Err(Foreign::ContentType));
        assert_eq!(stop(&[host.clone(), body.clone()]), Err(Foreign::ContentType), "a body of no declared type");
        assert_eq!(stop(&[host.clone(), (header::TRANSFER_ENCODING, "chunked")]), Err(Foreign::ContentType));
        assert_eq!(stop(&[host.clone()]), Ok(()), "no body, no Origin: a script's POST /stop");
        assert_eq!(stop(&[host, json, body]), Ok(()));
        assert_eq!(n.check(&Method::GET, &headers(&[(header::ORIGIN, "http://evil.example")])), Ok(()), "reads are guarded by Host");
    }
}
