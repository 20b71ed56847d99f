//! HTTP for the `hob serve` tests: a started server, and requests through ureq.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// `hob serve` started on a free port, killed on drop.
pub struct Served {
    pub child: Child,
    pub base: String,
    /// Everything it printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Served {
    /// `hob serve -m MODEL --port 0 EXTRA...`, once it says it is ready.
    pub fn start(model: &std::path::Path, extra: &[&str]) -> Served {
        let mut child = super::hob_command()
            .args([
                "serve",
                "-m",
                model.to_str().unwrap(),
                "--port",
                "0",
                "-t",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hob serve starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("ready on ").nth(1) {
                    tx.send(rest.trim().to_string()).ok();
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("hob serve did not get ready:\n{}", log.lock().unwrap()));
        Served { child, base, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_json(&self.url(path), body, &[])
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The log once it holds `needle` (its reader thread may lag the process; at most 10 s).
    pub fn log_with(&self, needle: &str) -> String {
        let started = std::time::Instant::now();
        while !self.log().contains(needle) && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.log()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// (status, body as JSON, or the text as a JSON string when it is not JSON).
fn read(mut r: ureq::http::Response<ureq::Body>) -> (u16, Value) {
    let status = r.status().as_u16();
    let mut text = String::new();
    r.body_mut()
        .as_reader()
        .read_to_string(&mut text)
        .expect("the body reads");
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

pub fn get(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = agent().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    read(req.call().expect("the request gets an answer"))
}

/// The response headers too.
pub fn post_raw(
    url: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Value) {
    let mut req = agent().post(url).header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send(body).expect("the request gets an answer");
    let hs = r
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let (status, v) = read(r);
    (status, hs, v)
}

pub fn post_json(url: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let (status, _, v) = post_raw(url, body.to_string().as_bytes(), headers);
    (status, v)
}

/// A streamed request: its status and the `data:` payloads of its events as they come.
pub struct Events {
    pub status: u16,
    lines: std::io::Lines<BufReader<Box<dyn Read + Send>>>,
}

impl Iterator for Events {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        for line in self.lines.by_ref() {
            let line = line.ok()?;
            if let Some(d) = line.strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
        None
    }
}

pub fn stream(url: &str, body: &Value) -> Events {
    let r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string().as_bytes())
        .expect("the request gets an answer");
    let status = r.status().as_u16();
    let reader: Box<dyn Read + Send> = Box::new(r.into_body().into_reader());
    Events {
        status,
        lines: BufReader::new(reader).lines(),
    }
}

/// The value of `name` in Prometheus text (the first line with that metric name and labels).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

/// A POST announcing a body of `len` bytes, of which only the first is sent: a server that
/// refuses the size answers before reading it (sending it all could meet a closed connection).
pub fn announce_large_body(base: &str, path: &str, len: usize) -> (u16, Value) {
    use std::io::Write;
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).expect("writes");
    let mut text = String::new();
    s.read_to_string(&mut text).ok();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::String(text.clone())),
    )
}
