//! The control port's transcripts (tests/vectors/control-port.txt), played against the client
//! through a fake daemon on loopback, and against the daemon's encoder of answers.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::time::Duration;

use vnet_client::{protocol, Control, Error};

const VECTORS: &str = include_str!("../../../tests/vectors/control-port.txt");

#[derive(Debug, Default)]
struct Case {
    title: String,
    call: String,
    lines: Vec<String>,
    send: Vec<String>,
    recv: Vec<String>,
    want: String,
    out: Vec<String>,
}

/// A word and the rest of the line (empty when there is no space).
fn split(line: &str) -> (&str, &str) {
    line.split_once(' ').unwrap_or((line, ""))
}

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for line in VECTORS.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (word, rest) = split(line);
        if word == "case" {
            cases.push(Case {
                title: rest.to_string(),
                ..Case::default()
            });
            continue;
        }
        let c = cases.last_mut().expect("a line before the first case");
        let rest = rest.to_string();
        match word {
            "call" => c.call = rest,
            "line" => c.lines.push(rest),
            "send" => c.send.push(rest),
            "recv" => c.recv.push(rest),
            "want" => c.want = rest,
            "out" => c.out.push(rest),
            other => panic!("unknown word {other:?} in {:?}", c.title),
        }
    }
    cases
}

fn text(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Runs the case's call against a fake daemon that answers `recv` and closes; returns what
/// the daemon read and the call's result.
fn play(c: &Case) -> (String, Result<Vec<String>, Error>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let answer = text(&c.recv);
    let daemon = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.write_all(answer.as_bytes()).expect("answer");
        s.shutdown(Shutdown::Write).expect("shutdown");
        let mut seen = String::new();
        s.read_to_string(&mut seen).expect("read");
        seen
    });
    let mut ctl = Control::connect(addr, Duration::from_secs(5), None).expect("connect");
    let (kind, arg) = split(&c.call);
    let result = match kind {
        "command" => ctl.command(arg),
        "auth" => ctl.auth(arg).map(|()| Vec::new()),
        "batch" => ctl.batch(&c.lines),
        other => panic!("unknown call {other:?} in {:?}", c.title),
    };
    drop(ctl);
    (daemon.join().expect("daemon"), result)
}

#[test]
fn the_client_follows_every_transcript() {
    let cases = cases();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for c in &cases {
        let (sent, result) = play(c);
        assert_eq!(sent, text(&c.send), "sent, in {:?}", c.title);
        let (want, arg) = split(&c.want);
        match (want, &result) {
            ("ok", Ok(out)) => assert_eq!(out, &c.out, "output, in {:?}", c.title),
            ("refused", Err(Error::Refused(m))) => assert_eq!(m, arg, "in {:?}", c.title),
            ("closed", Err(Error::Io(_)))
            | ("bad-answer", Err(Error::BadAnswer(_)))
            | ("invalid", Err(Error::Request(_))) => {}
            _ => panic!("{:?}: wanted {:?}, got {result:?}", c.title, c.want),
        }
    }
}

#[test]
fn the_daemon_answers_as_the_transcripts_say() {
    for c in cases() {
        let (want, arg) = split(&c.want);
        let encoded = match want {
            "ok" => protocol::answer(Ok(&text(&c.out))),
            "refused" => protocol::answer(Err(arg)),
            _ => continue,
        };
        assert_eq!(encoded, text(&c.recv), "in {:?}", c.title);
    }
}
