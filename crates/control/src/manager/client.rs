//! The manager's side of the daemons' control APIs: a blocking JSON client, and each
//! component's events gathered as they come.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use rdaq_proto::events::{Event, EventPage};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::board::SharedBoard;
use crate::http::lock;

/// A blocking JSON client of the control APIs.
pub(crate) struct Api {
    pub(crate) agent: ureq::Agent,
    /// `Authorization` header value for the daemons.
    pub(crate) bearer: Option<String>,
}

impl Api {
    pub(crate) fn new(timeout: Duration, token: Option<&crate::auth::Token>) -> Api {
        Api { agent: ureq::AgentBuilder::new().timeout_connect(Duration::from_millis(1000)).timeout(timeout).build(), bearer: token.map(|t| t.bearer()) }
    }

    pub(crate) fn request(&self, method: &str, url: &str) -> ureq::Request {
        let r = self.agent.request(method, url);
        match &self.bearer {
            Some(b) => r.set("Authorization", b),
            None => r,
        }
    }

    pub(crate) fn answer<T: DeserializeOwned>(url: &str, r: Result<ureq::Response, ureq::Error>) -> anyhow::Result<T> {
        match r {
            Ok(resp) => resp.into_json::<T>().with_context(|| format!("{url}: unexpected answer")),
            Err(ureq::Error::Status(code, resp)) => {
                let msg = resp.into_json::<serde_json::Value>().ok().and_then(|v| v["error"].as_str().map(String::from)).unwrap_or_default();
                bail!("{url}: {code} {msg}")
            }
            Err(e) => bail!("{url}: {e}"),
        }
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, host: SocketAddr, path: &str) -> anyhow::Result<T> {
        let url = format!("http://{host}{path}");
        Self::answer(&url, self.request("GET", &url).call())
    }

    pub(crate) fn text(&self, host: SocketAddr, path: &str) -> anyhow::Result<String> {
        let url = format!("http://{host}{path}");
        let r = self.request("GET", &url).call().map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
        r.into_string().with_context(|| format!("{url}: unreadable answer"))
    }

    pub(crate) fn send<T: DeserializeOwned>(&self, method: &str, host: SocketAddr, path: &str, body: &impl Serialize) -> anyhow::Result<T> {
        let url = format!("http://{host}{path}");
        Self::answer(&url, self.request(method, &url).send_json(serde_json::to_value(body)?))
    }
}

/// Events of one component, gathered as they come: `next` is the number to ask for next
/// (an acquisition's own start on a daemon that ran others).
pub(crate) struct Feed {
    pub(crate) host: SocketAddr,
    pub(crate) next: u64,
    pub(crate) dropped: u64,
    pub(crate) events: Vec<Event>,
}

impl Feed {
    pub(crate) fn new(host: SocketAddr, next: u64) -> Feed {
        Feed { host, next, dropped: 0, events: Vec::new() }
    }

    /// Fetches what is new; copies it to the manager's log.
    pub(crate) fn pull(&mut self, api: &Api, log: &SharedBoard) -> anyhow::Result<()> {
        loop {
            let page: EventPage = api.get(self.host, &format!("/events?since={}&limit=10000", self.next))?;
            self.dropped = self.dropped.max(page.dropped);
            if page.first > self.next {
                // the component's log dropped events before we read them: say so in ours
                let lost = page.first - self.next;
                let e = Event::Error { source: self.host.to_string(), message: format!("{lost} events dropped before they were read") };
                lock(log).events.push(e);
            }
            if page.events.is_empty() {
                return Ok(());
            }
            self.next = page.next;
            let mut b = lock(log);
            for e in &page.events {
                b.events.push(e.clone());
            }
            drop(b);
            self.events.extend(page.events);
        }
    }
}
