//! Access control of the control APIs: a bearer token (from a file or `RDAQ_TOKEN`) that
//! every mutating call (any method but GET and HEAD) must carry, and reads too when asked.
//! Tokens are compared in constant time; refusals change nothing, answer 401 (no token) or
//! 403 (a wrong one) with a one-line reason, and are counted and logged.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::site::{Foreign, Names};

/// The environment variable a token is read from when no `--token-file` is given.
pub const TOKEN_ENV: &str = "RDAQ_TOKEN";

/// The path prefix of the dashboard page's files: open even when reads need the token.
pub const ASSETS: &str = "/dashboard/assets/";

/// Fewer characters than this are refused: a token is a secret, not a password to remember.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct AccessArgs {
    /// File holding the bearer token that mutating control calls need (default: the
    /// RDAQ_TOKEN environment variable; neither: the API is open to anyone who can reach it).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Reads (status, events, metrics, the dashboard) need the token too.
    #[arg(long)]
    pub protect_reads: bool,
    /// A name of this host that clients put in `Host` (besides IP addresses, localhost and
    /// the machine's own name, which are always served); repeat for more.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("--token-file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: the token has {1} characters, at least {MIN_TOKEN_LEN} are needed (e.g. `openssl rand -hex 32`)")]
    Short(String, usize),
    #[error("--protect-reads needs a token (--token-file or {TOKEN_ENV})")]
    ReadsWithoutToken,
    /// A token variable that is set but holds no token: an operator who set it meant to
    /// protect the API, so it is not left open.
    #[error("{TOKEN_ENV} is set but {0}: unset it to leave the API open, or set a token of at least {MIN_TOKEN_LEN} characters")]
    BadEnv(&'static str),
}

/// A bearer token; never printed.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    fn new(text: &str, from: &str) -> Result<Token, AuthError> {
        let t = text.trim();
        if t.chars().count() < MIN_TOKEN_LEN {
            return Err(AuthError::Short(from.to_string(), t.chars().count()));
        }
        Ok(Token(t.to_string()))
    }

    /// The `Authorization` header value that carries it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl AccessArgs {
    /// The token from `--token-file`, else from [`TOKEN_ENV`], else none.
    pub fn token(&self) -> Result<Option<Token>, AuthError> {
        if let Some(p) = &self.token_file {
            return read_token(p).map(Some);
        }
        token_from_env(std::env::var(TOKEN_ENV))
    }

    pub fn access(&self) -> Result<Access, AuthError> {
        let token = self.token()?;
        if self.protect_reads && token.is_none() {
            return Err(AuthError::ReadsWithoutToken);
        }
        Ok(Access { token, protect_reads: self.protect_reads, names: Names::of_this_host(&self.allow_hosts), refused: AtomicU64::new(0) })
    }
}

/// The token [`TOKEN_ENV`] holds: none when it is not set; an error when it is set but
/// blank or not UTF-8.
fn token_from_env(v: Result<String, std::env::VarError>) -> Result<Option<Token>, AuthError> {
    match v {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(AuthError::BadEnv("not UTF-8")),
        Ok(t) if t.trim().is_empty() => Err(AuthError::BadEnv("blank")),
        Ok(t) => Token::new(&t, TOKEN_ENV).map(Some),
    }
}

/// The token of a token file: its first line, without surrounding blanks.
fn read_token(p: &Path) -> Result<Token, AuthError> {
    let text = std::fs::read_to_string(p).map_err(|e| AuthError::Read(p.to_path_buf(), e))?;
    warn_if_readable_by_others(p);
    Token::new(text.lines().next().unwrap_or(""), &format!("--token-file {}", p.display()))
}

fn warn_if_readable_by_others(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(p) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!("token file {} can be read by other users (chmod 600 it)", p.display());
        }
    }
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header (401).
    Missing,
    /// A bearer token that is not this daemon's (403).
    Wrong,
    /// A call a page of another site could have made.
    Foreign(Foreign),
}

impl From<Foreign> for Refusal {
    fn from(f: Foreign) -> Refusal {
        Refusal::Foreign(f)
    }
}

/// Who may call what, and how many calls were refused.
#[derive(Debug, Default)]
pub struct Access {
    token: Option<Token>,
    protect_reads: bool,
    /// The names `Host` may give ([`crate::site`]).
    names: Names,
    refused: AtomicU64,
}

impl Access {
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    pub fn token(&self) -> Option<&Token> {
        self.token.as_ref()
    }

    /// Calls refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether a call with `method` on `path` and `authorization` header may go on. The
    /// dashboard's page and files carry no data: reading them is always open (the page then
    /// asks for the token where reads need it).
    pub fn check(&self, method: &Method, path: &str, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let Some(token) = &self.token else { return Ok(()) };
        let reads = method == Method::GET || method == Method::HEAD;
        let shell = path == "/" || path.starts_with(ASSETS);
        if reads && (!self.protect_reads || shell) {
            return Ok(());
        }
        let given = authorization.and_then(|h| h.as_bytes().strip_prefix(b"Bearer ")).ok_or(Refusal::Missing)?;
        if bool::from(given.ct_eq(token.0.as_bytes())) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

/// Middleware: lets a call through, or answers the refusal and counts and logs it. A call
/// a foreign page could have made ([`crate::site`]) is refused before its token is looked at.
pub async fn guard(State(access): State<Arc<Access>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, req: Request, next: Next) -> Response {
    let refusal = match access.names.check(req.method(), req.headers()) {
        Err(f) => Err(f.into()),
        Ok(()) => access.check(req.method(), req.uri().path(), req.headers().get(header::AUTHORIZATION)),
    };
    let Err(r) = refusal else {
        return next.run(req).await;
    };
    let n = access.refused.fetch_add(1, Ordering::Relaxed) + 1;
    let (status, why) = match r {
        Refusal::Missing => (StatusCode::UNAUTHORIZED, "this call needs the API token: send `Authorization: Bearer <token>`"),
        Refusal::Wrong => (StatusCode::FORBIDDEN, "wrong API token"),
        Refusal::Foreign(f @ Foreign::Host) => (StatusCode::MISDIRECTED_REQUEST, f.why()),
        Refusal::Foreign(f @ Foreign::Origin) => (StatusCode::FORBIDDEN, f.why()),
        Refusal::Foreign(f @ Foreign::ContentType) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, f.why()),
    };
    tracing::warn!(method = %req.method(), path = req.uri().path(), %peer, refused = n, "refused {} {} from {peer}: {why}", req.method(), req.uri().path());
    let mut resp = crate::answer::ApiError(status, why.into()).into_response();
    if r == Refusal::Missing {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"rdaq\""));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(protect_reads: bool) -> Access {
        Access { token: Some(Token::new("0123456789abcdef0123", "test").unwrap()), protect_reads, names: Names::default(), refused: AtomicU64::new(0) }
    }

    fn h(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn mutating_calls_need_the_exact_token() {
        let a = access(false);
        assert_eq!(a.check(&Method::POST, "/stop", None), Err(Refusal::Missing));
        assert_eq!(a.check(&Method::PUT, "/buffers", Some(&h("Basic 0123456789abcdef0123"))), Err(Refusal::Missing));
        assert_eq!(a.check(&Method::POST, "/start", Some(&h("Bearer 0123456789abcdef012"))), Err(Refusal::Wrong));
        assert_eq!(a.check(&Method::POST, "/start", Some(&h("Bearer 0123456789abcdef01234"))), Err(Refusal::Wrong));
        assert_eq!(a.check(&Method::DELETE, "/x", Some(&h("Bearer 0123456789abcdef0123"))), Ok(()));
        assert_eq!(a.check(&Method::GET, "/status", None), Ok(()), "reads are open unless protected");
        assert_eq!(access(true).check(&Method::GET, "/status", None), Err(Refusal::Missing));
        assert_eq!(access(true).check(&Method::GET, "/dashboard/live", None), Err(Refusal::Missing));
        assert_eq!(access(true).check(&Method::GET, "/status", Some(&h("Bearer 0123456789abcdef0123"))), Ok(()));
        assert_eq!(access(true).check(&Method::GET, "/", None), Ok(()), "the dashboard's page carries no data");
        assert_eq!(access(true).check(&Method::GET, "/dashboard/assets/app.js", None), Ok(()));
        assert_eq!(access(true).check(&Method::POST, "/", None), Err(Refusal::Missing), "only reads of the page are open");
        assert_eq!(Access::default().check(&Method::POST, "/stop", None), Ok(()), "no token: open");
    }

    #[test]
    fn short_tokens_and_protected_reads_without_a_token_are_refused() {
        assert!(matches!(Token::new(" short\n", "f"), Err(AuthError::Short(_, 5))));
        assert_eq!(Token::new("0123456789abcdef\n", "f").unwrap().bearer(), "Bearer 0123456789abcdef");
        assert_eq!(format!("{:?}", Token::new("0123456789abcdef", "f").unwrap()), "Token(..)");
        let args = AccessArgs { token_file: Some("/nonexistent/token".into()), ..AccessArgs::default() };
        assert!(matches!(args.access(), Err(AuthError::Read(..))));
    }

    #[test]
    fn a_token_variable_set_blank_is_refused_and_a_file_gives_its_first_line() {
        assert!(token_from_env(Err(std::env::VarError::NotPresent)).unwrap().is_none(), "not set: open");
        assert!(matches!(token_from_env(Ok(" \n".into())), Err(AuthError::BadEnv("blank"))));
        assert!(matches!(token_from_env(Err(std::env::VarError::NotUnicode("x".into()))), Err(AuthError::BadEnv(_))));
        assert_eq!(token_from_env(Ok("0123456789abcdef".into())).unwrap().unwrap().bearer(), "Bearer 0123456789abcdef");
        let dir = std::env::temp_dir().join(format!("rdaq-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "  0123456789abcdef0123  \n# a comment the first line does not hold\n").unwrap();
        assert_eq!(read_token(&f).unwrap().bearer(), "Bearer 0123456789abcdef0123");
        std::fs::write(&f, "\n0123456789abcdef0123\n").unwrap();
        assert!(matches!(read_token(&f), Err(AuthError::Short(_, 0))), "the first line is the token, even blank");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
