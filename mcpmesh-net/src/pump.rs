//! The line pump: moves runs of lines from a reader to a writer, unchanged.
//!
//! One direction per call; a session runs two of them under a `select!`. Each run is written
//! as one `write_all` of the bytes as they were read. An oversized line is dropped and answered
//! on the client-facing writer; the third such strike ends the direction. A long line goes on
//! as it arrives (cut-through), so an 8 MiB message is never held whole by a node and every
//! hop works on it at once. The checked variant lets the node refuse single lines (limits)
//! without touching the ones it passes: it decides on a long line from a strict scan of it
//! ([`crate::scan`]) and holds back only its closing bracket until then.
//!
//! An observer may ask the plain pump to hold lines whole while it waits for an answer it
//! edits (the serving node filtering a `tools/list` answer): while it says so, a long line is
//! collected up to the cap instead of passed on, and each line is offered to it for
//! rewriting. Otherwise nothing is held and nothing is looked at twice.
//!
//! A plain pump holds its writer's lock across a long line, so that nothing lands in its
//! middle; whoever else writes there ends the pump first with its `stop` future, which makes it
//! end a half-written line with a newline and let go.

use std::future::Future;
use std::io;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::errors::{ErrorCode, ErrorFrame};
use crate::scan::{Scan, Scanned};
use crate::skeleton::Skeleton;
use crate::transport::{Batch, FrameReader, Part, Piece};

/// Oversized frames tolerated per direction before the session is closed.
pub const MAX_STRIKES: u8 = 3;

/// How much of a long line from the client is read before it goes on undecided, when its
/// start did not tell whether it may (see [`DecideLong::foresee`]).
pub const LOOK_AHEAD: usize = 256 * 1024;

/// How a forwarding direction ended.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("reading failed: {0}")]
    Read(io::Error),
    #[error("writing failed: {0}")]
    Write(io::Error),
    #[error("three oversized or unparsable frames; session closed")]
    TooManyStrikes,
}

/// What a plain pump passed on, for its observer.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// A run of whole lines.
    Lines(&'a [u8]),
    /// One long line, passed on in parts: its length and the [`Skeleton`] of it (`None` when
    /// it was not one JSON object).
    Long {
        skeleton: Option<&'a [u8]>,
        len: usize,
    },
}

impl Seen<'_> {
    /// Bytes passed on.
    pub fn len(&self) -> usize {
        match self {
            Seen::Lines(run) => run.len(),
            Seen::Long { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with each non-blank frame to peek at (a long line's skeleton stands for it)
    /// and the frame's length on the wire, newline included.
    pub fn each_frame(&self, mut f: impl FnMut(&[u8], usize)) {
        match self {
            Seen::Lines(run) => {
                for line in crate::transport::lines(run) {
                    f(line, line.len() + 1);
                }
            }
            Seen::Long {
                skeleton: Some(skeleton),
                len,
            } => f(skeleton, *len),
            Seen::Long { skeleton: None, .. } => {}
        }
    }
}

/// Who watches a plain pump ([`forward_observed`]): sees what it passes on, and may name the
/// request a cut-off answer was answering when the answer had not named it yet.
pub trait Observer {
    /// Sees each run before it is written, a long line passed on in parts before its last part
    /// is written or once it was cut off (its length, no skeleton), and the pump's own answers.
    /// It may record, never alter.
    fn seen(&mut self, seen: Seen<'_>);

    /// The id of the one request still waiting for an answer, when exactly one is. Asked only
    /// for an answer cut off at the cap before its id went by (a `result` or `error` member
    /// written before the `id`, as the TypeScript SDK writes them), which can only answer a
    /// request still waiting.
    fn lone_pending(&mut self) -> Option<Box<RawValue>> {
        None
    }

    /// Whether lines must be held whole and offered to [`Observer::rewrite`] now. Asked as
    /// each run of lines or long line arrives; while it is `false` lines pass cut-through and
    /// `rewrite` is never called.
    fn holding(&mut self) -> bool {
        false
    }

    /// What to pass on in place of `line` (one whole line, without its line ending), or
    /// `None` to pass it as it is. Called before [`Observer::seen`] sees the line's run.
    fn rewrite(&mut self, _line: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// A closure that only watches.
struct Watch<F>(F);

impl<F: FnMut(Seen<'_>)> Observer for Watch<F> {
    fn seen(&mut self, seen: Seen<'_>) {
        (self.0)(seen)
    }
}

/// How a plain pump treats a line still without its newline after [`crate::transport::PASS_AT`]
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongLines {
    /// Passes it on in parts as it arrives (cut-through): no node holds a long answer whole,
    /// and every hop works on it at once.
    PassOn,
    /// Passes it on in parts as it arrives, from the client: a line that runs past the cap is
    /// ended there and answered on `client` as the request it was (its id, when it went by).
    /// The next hop gets a line that ends inside its value, which no parser takes for a
    /// message and which the serving node does not answer again.
    FromClient,
}

/// Forwards every line from `reader` to `dest` until EOF (`Ok`) or a failure.
///
/// When `stop` resolves the pump ends (`Ok`): a long line it was passing on is ended there with
/// a newline, so that what the caller writes next starts a line of its own.
///
/// `observe` sees each run before it is written, and a long line passed on in parts before its
/// last part is written, or once it was cut off (its length, no skeleton); it may record, never
/// alter. Oversized lines are answered with
/// `-32051` on `client`, the writer facing the MCP client; for the direction that carries the
/// client's own frames that is the reverse direction's writer. A long line that runs past the
/// cap after its first parts went on is ended there with a newline — the reader downstream
/// gets one unparsable line no longer than the cap, never a line glued to the next. With
/// [`LongLines::PassOn`] (towards the client, where `dest` is `client`) it is followed by a
/// `-32051` that answers the request the line was answering, when the part that went on named
/// it (else id null; [`forward_observed`] can name it in more cases), and `observe` sees that
/// answer like any line, so whoever keeps account of requests sees the request end. With
/// [`LongLines::FromClient`] the `-32051` answers the cut request itself, on `client`.
pub async fn forward<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    client: &Mutex<C>,
    long: LongLines,
    stop: impl Future<Output = ()>,
    observe: impl FnMut(Seen<'_>),
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    forward_observed(reader, dest, client, long, stop, &mut Watch(observe)).await
}

/// [`forward`] with an [`Observer`]: when an answer is cut off before its id went by, the
/// refusal answers the observer's [`Observer::lone_pending`] request, if it names one.
pub async fn forward_observed<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    client: &Mutex<C>,
    long: LongLines,
    stop: impl Future<Output = ()>,
    observe: &mut impl Observer,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut strikes = 0u8;
    let too_large = || ErrorFrame::new(ErrorCode::FrameTooLarge).to_line();
    let mut stop = std::pin::pin!(stop);
    loop {
        let piece = async { reader.next_piece().await };
        let piece = tokio::select! {
            piece = piece => piece,
            () = &mut stop => return Ok(()),
        };
        match piece.map_err(PumpError::Read)? {
            None => return Ok(()),
            Some(Piece::Lines(run)) => {
                let edited = if observe.holding() {
                    rewritten(&run, observe)
                } else {
                    None
                };
                let run = edited.as_deref().unwrap_or(&run);
                observe.seen(Seen::Lines(run));
                write_run(dest, run).await.map_err(PumpError::Write)?;
            }
            Some(Piece::Oversize) => strike(&mut strikes, client, &too_large()).await?,
            Some(Piece::LongStart(head)) if observe.holding() => {
                match hold_long_line(reader, head, &mut stop).await? {
                    Held::Whole(line) => {
                        let edited = rewritten(&line, observe);
                        let line = edited.as_deref().unwrap_or(&line);
                        observe.seen(Seen::Lines(line));
                        write_run(dest, line).await.map_err(PumpError::Write)?;
                    }
                    Held::Cut(skeleton) => {
                        let id = cut_answers(&skeleton, observe);
                        let refusal = ErrorFrame::new(ErrorCode::FrameTooLarge)
                            .id(id.as_deref())
                            .message("the answer is larger than the frame cap")
                            .to_line();
                        observe.seen(Seen::Lines(&refusal));
                        strike(&mut strikes, client, &refusal).await?;
                    }
                    Held::Stopped => return Ok(()),
                }
            }
            Some(Piece::LongStart(head)) => {
                let to = (long, client);
                match pass_long_line(reader, dest, head, &mut stop, observe, to).await? {
                    LineEnd::Whole => {}
                    LineEnd::Cut => count_strike(&mut strikes)?,
                    LineEnd::Stopped => return Ok(()),
                }
            }
        }
    }
}

/// `run` with each line the observer rewrites replaced; `None` when it rewrote none.
fn rewritten(run: &[u8], observe: &mut impl Observer) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut at = 0;
    for line in run.split_inclusive(|b| *b == b'\n') {
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let edit = if body.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            observe.rewrite(body)
        };
        if let Some(mut edit) = edit {
            let out = out.get_or_insert_with(|| run[..at].to_vec());
            edit.push(b'\n');
            out.extend(edit);
        } else if let Some(out) = &mut out {
            out.extend_from_slice(line);
        }
        at += line.len();
    }
    out
}

/// A long line collected whole for an observer that edits lines.
enum Held {
    Whole(Vec<u8>),
    /// It ran past the cap; nothing of it went on.
    Cut(Skeleton),
    Stopped,
}

/// Collects the rest of the long line `head` started, up to the cap.
async fn hold_long_line<R>(
    reader: &mut FrameReader<R>,
    head: Bytes,
    stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Held, PumpError>
where
    R: AsyncRead + Unpin,
{
    let mut skeleton = Skeleton::default();
    skeleton.feed(&head);
    let mut line = head.to_vec();
    loop {
        let part = tokio::select! {
            part = reader.next_part() => part.map_err(PumpError::Read)?,
            () = stop.as_mut() => return Ok(Held::Stopped),
        };
        match part {
            Part::More(bytes) => {
                skeleton.feed(&bytes);
                line.extend_from_slice(&bytes);
            }
            Part::Last(bytes) => {
                line.extend_from_slice(&bytes);
                return Ok(Held::Whole(line));
            }
            Part::Cut => return Ok(Held::Cut(skeleton)),
        }
    }
}

/// How a long line passed on in parts ended.
enum LineEnd {
    /// It arrived whole.
    Whole,
    /// It ran past the cap, was cut off and answered on its writer.
    Cut,
    /// The pump was stopped halfway and ended the line with a newline.
    Stopped,
}

/// Passes one long line on part by part, holding `dest` so that nothing is written into its
/// middle, until it ends, runs past the cap, or `stop` resolves.
async fn pass_long_line<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    head: Bytes,
    stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    observe: &mut impl Observer,
    (long, client): (LongLines, &Mutex<C>),
) -> Result<LineEnd, PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut w = dest.lock().await;
    let mut skeleton = Skeleton::default();
    let mut len = head.len();
    skeleton.feed(&head);
    w.write_all(&head).await.map_err(PumpError::Write)?;
    loop {
        let part = tokio::select! {
            part = reader.next_part() => part.map_err(PumpError::Read)?,
            () = stop.as_mut() => {
                tracing::debug!(len, "a pump was stopped halfway through a long line");
                observe.seen(Seen::Long {
                    skeleton: None,
                    len: len + 1,
                });
                w.write_all(b"\n").await.map_err(PumpError::Write)?;
                w.flush().await.map_err(PumpError::Write)?;
                return Ok(LineEnd::Stopped);
            }
        };
        match part {
            Part::More(bytes) => {
                skeleton.feed(&bytes);
                len += bytes.len();
                w.write_all(&bytes).await.map_err(PumpError::Write)?;
            }
            Part::Last(bytes) => {
                skeleton.feed(&bytes);
                len += bytes.len();
                let skeleton = skeleton.finish();
                observe.seen(Seen::Long {
                    skeleton: skeleton.as_deref(),
                    len,
                });
                w.write_all(&bytes).await.map_err(PumpError::Write)?;
                w.flush().await.map_err(PumpError::Write)?;
                return Ok(LineEnd::Whole);
            }
            Part::Cut => {
                tracing::debug!(len, "a long line ran past the frame cap and was cut off");
                observe.seen(Seen::Long {
                    skeleton: None,
                    len,
                });
                if long == LongLines::FromClient {
                    w.write_all(b"\n").await.map_err(PumpError::Write)?;
                    w.flush().await.map_err(PumpError::Write)?;
                    drop(w);
                    let refusal = cut_request(skeleton.so_far());
                    write_run(client, &refusal)
                        .await
                        .map_err(PumpError::Write)?;
                    return Ok(LineEnd::Cut);
                }
                let id = cut_answers(&skeleton, observe);
                let mut refusal = b"\n".to_vec();
                refusal.extend(
                    ErrorFrame::new(ErrorCode::FrameTooLarge)
                        .id(id.as_deref())
                        .message("the answer ran past the frame cap and was cut off there")
                        .to_line(),
                );
                observe.seen(Seen::Lines(&refusal));
                w.write_all(&refusal).await.map_err(PumpError::Write)?;
                w.flush().await.map_err(PumpError::Write)?;
                return Ok(LineEnd::Cut);
            }
        }
    }
}

/// The request a line cut off at the cap was answering: the id it named before the cut, or,
/// for an answer whose `result` or `error` came before its id, the one request still waiting.
/// `None` for anything else (a request or notification from the server, not JSON).
fn cut_answers(skeleton: &Skeleton, observe: &mut impl Observer) -> Option<Box<RawValue>> {
    let so_far = skeleton.so_far()?;
    let peek = crate::jsonrpc::peek_response(&so_far)?;
    if let Some(id) = peek.answers() {
        return Some(id.to_owned());
    }
    let answer_first = matches!(
        skeleton.open_key(),
        Some(br#""result""#) | Some(br#""error""#)
    );
    // No id went by (`answers` would have named it) and no method: a response, so far.
    if answer_first && peek.method.is_none() {
        return observe.lone_pending();
    }
    None
}

/// The next run of lines; an oversized line on the way is answered on `client` and counted.
async fn next_run<R, C>(
    reader: &mut FrameReader<R>,
    client: &Mutex<C>,
    strikes: &mut u8,
) -> Result<Option<Bytes>, PumpError>
where
    R: AsyncRead + Unpin,
    C: AsyncWrite + Unpin,
{
    loop {
        match reader.next_batch().await.map_err(PumpError::Read)? {
            None => return Ok(None),
            Some(Batch::Lines(run)) => return Ok(Some(run)),
            Some(Batch::Oversize) => {
                let line = ErrorFrame::new(ErrorCode::FrameTooLarge).to_line();
                strike(strikes, client, &line).await?;
            }
        }
    }
}

/// What to do with one line the client sent.
#[derive(Debug)]
pub enum Verdict {
    /// Pass it on, unchanged.
    Forward,
    /// Drop it and write these bytes (error frames, or nothing) to the client instead.
    Answer(Vec<u8>),
    /// As `Answer`, and count a strike against the session.
    Strike(Vec<u8>),
    /// Pass on these bytes (a whole line, newline included) in its place: the one edit the
    /// node makes to the caller's frames, writing its identity into a request for backends
    /// that need it (the other direction's one edit is an [`Observer::rewrite`]).
    Replace(Vec<u8>),
}

/// How [`forward_checked`] decides on lines too long to hold ([`crate::transport::PASS_AT`]),
/// which it passes on as they arrive.
pub trait DecideLong: Send {
    /// Whether the long line just starting may go on before it is decided on. When not (a
    /// caller just refused, or at its in-flight cap), it is held whole and given to `check`
    /// like any line, so that what would be refused never reaches the server.
    fn may_pass(&mut self) -> bool;

    /// A look at the start of a long line that may pass, before any of it goes on: `Some(true)`
    /// lets it go on, `Some(false)` holds it whole (it would be refused, as far as its start
    /// tells: it is then given to `check` like any line and never reaches the server), `None`
    /// asks for more of it. After [`LOOK_AHEAD`] bytes it goes on undecided.
    fn foresee(&mut self, scan: &Scan) -> Option<bool>;

    /// The verdict on a line that went on, from how it ended ([`Scanned`], which holds what a
    /// decision reads of it) and its length on the wire.
    fn decide(&mut self, scanned: Scanned, len: usize) -> Verdict;
}

/// Like [`forward`], with a decision per line: each line of a run is forwarded, dropped and
/// answered, or replaced. Forwarded lines still go out as whole slices of the bytes read,
/// unchanged.
///
/// With `long`, a line still without its newline after [`crate::transport::PASS_AT`] bytes
/// goes on in parts as it arrives, scanned ([`Scan`]) on the way, and only its top-level
/// closing bracket (and what follows it) waits for `long`'s verdict: forwarded, it follows;
/// refused, the line is ended without it, so the server reads no message in it, and the
/// answer goes to the client. Before any of it goes on, `long` looks at its start
/// ([`DecideLong::foresee`]): one it would refuse is held whole and given to `check`.
/// `Replace` cannot be done to a line already on its way and is a refusal without an answer:
/// a checker that replaces lines passes no `long`, and every line is then held whole and
/// given to `check`.
pub async fn forward_checked<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    client: &Mutex<C>,
    mut check: impl FnMut(&[u8]) -> Verdict,
    mut long: Option<&mut dyn DecideLong>,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let mut strikes = 0u8;
    loop {
        let run = match long.as_deref_mut() {
            None => match next_run(reader, client, &mut strikes).await? {
                None => return Ok(()),
                Some(run) => run,
            },
            Some(decide) => match reader.next_piece().await.map_err(PumpError::Read)? {
                None => return Ok(()),
                Some(Piece::Lines(run)) => run,
                Some(Piece::Oversize) => {
                    let line = ErrorFrame::new(ErrorCode::FrameTooLarge).to_line();
                    strike(&mut strikes, client, &line).await?;
                    continue;
                }
                Some(Piece::LongStart(head)) => {
                    let ahead = match decide.may_pass() {
                        true => look_ahead(reader, head, decide).await?,
                        false => Ahead::Hold(vec![head]),
                    };
                    let held = match ahead {
                        Ahead::Pass(start) => {
                            pass_checked_line(reader, dest, client, start, decide, &mut strikes)
                                .await?;
                            continue;
                        }
                        Ahead::Hold(start) => hold_line(reader, start).await?,
                        Ahead::Whole(line) => Some(line),
                        Ahead::Cut(refusal) => {
                            strike(&mut strikes, client, &refusal).await?;
                            continue;
                        }
                    };
                    match held {
                        Some(line) => Bytes::from(line),
                        None => {
                            let line = ErrorFrame::new(ErrorCode::FrameTooLarge).to_line();
                            strike(&mut strikes, client, &line).await?;
                            continue;
                        }
                    }
                }
            },
        };
        check_run(&run, dest, client, &mut check, &mut strikes).await?;
    }
}

/// Decides on each line of one run: kept lines go out as whole slices of it.
async fn check_run<W, C>(
    run: &[u8],
    dest: &Mutex<W>,
    client: &Mutex<C>,
    check: &mut impl FnMut(&[u8]) -> Verdict,
    strikes: &mut u8,
) -> Result<(), PumpError>
where
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let (mut kept_from, mut answers, mut struck) = (0, Vec::new(), 0u8);
    let mut start = 0;
    while start < run.len() {
        let end = memchr::memchr(b'\n', &run[start..]).map_or(run.len(), |i| start + i + 1);
        let line = &run[start..end];
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let verdict = if body.iter().all(u8::is_ascii_whitespace) {
            Verdict::Forward
        } else {
            check(body)
        };
        let (answer, strike) = match verdict {
            Verdict::Forward => (None, false),
            Verdict::Answer(bytes) => (Some(bytes), false),
            Verdict::Strike(bytes) => (Some(bytes), true),
            Verdict::Replace(bytes) => {
                write_slice(dest, &run[kept_from..start]).await?;
                write_slice(dest, &bytes).await?;
                kept_from = end;
                (None, false)
            }
        };
        if let Some(bytes) = answer {
            // Everything kept before this line goes out first, as one slice.
            write_slice(dest, &run[kept_from..start]).await?;
            answers.extend(bytes);
            kept_from = end;
            struck += u8::from(strike);
        }
        start = end;
    }
    write_slice(dest, &run[kept_from..]).await?;
    if !answers.is_empty() {
        write_run(client, &answers)
            .await
            .map_err(PumpError::Write)?;
    }
    *strikes = strikes.saturating_add(struck);
    if *strikes >= MAX_STRIKES {
        return Err(PumpError::TooManyStrikes);
    }
    Ok(())
}

/// What a look at the start of a long line made of it.
enum Ahead {
    /// It goes on, from this start.
    Pass(Box<Start>),
    /// Its parts so far: it is held whole.
    Hold(Vec<Bytes>),
    /// It ended while being looked at.
    Whole(Vec<u8>),
    /// It ran past the cap while being looked at: its refusal.
    Cut(Vec<u8>),
}

impl Ahead {
    fn pass(line: Passing, through: Vec<Bytes>) -> Self {
        Ahead::Pass(Box::new(Start { line, through }))
    }
}

/// Reads the start of the long line `head` began until `decide` can tell whether it may go on
/// (see [`DecideLong::foresee`]), for at most [`LOOK_AHEAD`] bytes. What it scanned is handed
/// on with the line, never scanned again.
async fn look_ahead<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    head: Bytes,
    decide: &mut dyn DecideLong,
) -> Result<Ahead, PumpError> {
    let mut line = Passing::default();
    // Asked first with nothing read: a decider with nothing to look for lets it go at once.
    match decide.foresee(&line.scan) {
        Some(true) => {
            let go = line.admit(&head);
            return Ok(Ahead::pass(line, vec![head.slice(..go)]));
        }
        Some(false) => return Ok(Ahead::Hold(vec![head])),
        None => {}
    }
    let (mut start, mut through) = (Vec::new(), Vec::new());
    let mut part = head;
    loop {
        let go = line.admit(&part);
        through.push(part.slice(..go));
        start.push(part);
        // A broken line goes on, to be stopped where it broke.
        let seen = match line.scan.broken() {
            true => Some(true),
            false => decide.foresee(&line.scan),
        };
        match seen {
            Some(true) => return Ok(Ahead::pass(line, through)),
            Some(false) => return Ok(Ahead::Hold(start)),
            None if line.len >= LOOK_AHEAD => return Ok(Ahead::pass(line, through)),
            None => {}
        }
        part = match reader.next_part().await.map_err(PumpError::Read)? {
            Part::More(bytes) => bytes,
            Part::Last(bytes) => {
                start.push(bytes);
                return Ok(Ahead::Whole(start.concat()));
            }
            Part::Cut => return Ok(Ahead::Cut(cut_request(Some(line.scan.so_far())))),
        };
    }
}

/// A long line's start as [`look_ahead`] left it.
struct Start {
    line: Passing,
    /// Bytes already scanned and let through, not yet written.
    through: Vec<Bytes>,
}

/// One long line from the client, begun by `start`, passed on in parts under `dest`'s lock with
/// its closing bracket held back, then decided on (see [`forward_checked`]).
async fn pass_checked_line<R, W, C>(
    reader: &mut FrameReader<R>,
    dest: &Mutex<W>,
    client: &Mutex<C>,
    start: Box<Start>,
    decide: &mut dyn DecideLong,
    strikes: &mut u8,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    C: AsyncWrite + Unpin,
{
    let Start { mut line, through } = *start;
    let mut w = dest.lock().await;
    for bytes in through.iter().filter(|b| !b.is_empty()) {
        w.write_all(bytes).await.map_err(PumpError::Write)?;
    }
    let ended = loop {
        match reader.next_part().await.map_err(PumpError::Read)? {
            Part::More(bytes) => line.pass(&bytes, &mut *w).await?,
            Part::Last(bytes) => {
                line.pass(&bytes, &mut *w).await?;
                break true;
            }
            Part::Cut => break false,
        }
    };
    let (verdict, len) = if ended {
        let len = line.len;
        (decide.decide(line.scan.finish(), len), len)
    } else {
        tracing::debug!(
            len = line.len,
            "a request ran past the frame cap and was cut off"
        );
        (
            Verdict::Strike(cut_request(Some(line.scan.so_far()))),
            line.len,
        )
    };
    let answer = match verdict {
        Verdict::Forward => {
            w.write_all(&line.held).await.map_err(PumpError::Write)?;
            None
        }
        Verdict::Answer(answer) => Some((answer, false)),
        Verdict::Strike(answer) => Some((answer, true)),
        Verdict::Replace(_) => Some((Vec::new(), false)),
    };
    if answer.is_some() && line.last != Some(b'\n') {
        w.write_all(b"\n").await.map_err(PumpError::Write)?;
    }
    w.flush().await.map_err(PumpError::Write)?;
    drop(w);
    tracing::trace!(len, "a long line from the client was decided on");
    match answer {
        Some((answer, struck)) => {
            if !answer.is_empty() {
                write_run(client, &answer).await.map_err(PumpError::Write)?;
            }
            if struck {
                count_strike(strikes)?;
            }
            Ok(())
        }
        None => Ok(()),
    }
}

/// The long line `start` began, whole; `None` when it ran past the cap.
async fn hold_line<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    start: Vec<Bytes>,
) -> Result<Option<Vec<u8>>, PumpError> {
    let mut line = start.concat();
    loop {
        match reader.next_part().await.map_err(PumpError::Read)? {
            Part::More(bytes) => line.extend_from_slice(&bytes),
            Part::Last(bytes) => {
                line.extend_from_slice(&bytes);
                return Ok(Some(line));
            }
            Part::Cut => return Ok(None),
        }
    }
}

/// The refusal of a request cut off at the cap (`so_far`: the members that went by), naming it
/// when its id went by.
fn cut_request(so_far: Option<Vec<u8>>) -> Vec<u8> {
    let so_far = so_far.unwrap_or_default();
    let peek = crate::jsonrpc::peek(&so_far);
    let id = peek
        .as_ref()
        .filter(|p| p.method.is_some())
        .and_then(|p| p.id);
    ErrorFrame::new(ErrorCode::FrameTooLarge)
        .id(id)
        .message("the request ran past the frame cap and was cut off there")
        .to_line()
}

/// A long line on its way: what went on, what is held back.
#[derive(Default)]
struct Passing {
    scan: Scan,
    /// From the top-level closing bracket on.
    held: Vec<u8>,
    len: usize,
    /// The last byte written.
    last: Option<u8>,
}

impl Passing {
    /// Scans `part`: how many of its first bytes go on now (the rest is held back). The caller
    /// writes them.
    fn admit(&mut self, part: &[u8]) -> usize {
        self.len += part.len();
        if self.scan.broken() {
            return 0;
        }
        let closed = self.scan.closed();
        let at = self.scan.feed(part);
        if self.scan.broken() {
            // Nothing more goes on: the line ends unclosed.
            self.held.clear();
            return 0;
        }
        let at = if closed { 0 } else { at.unwrap_or(part.len()) };
        self.held.extend_from_slice(&part[at..]);
        if at > 0 {
            self.last = Some(part[at - 1]);
        }
        at
    }

    async fn pass<W: AsyncWrite + Unpin>(
        &mut self,
        part: &[u8],
        w: &mut W,
    ) -> Result<(), PumpError> {
        let go = self.admit(part);
        if go > 0 {
            w.write_all(&part[..go]).await.map_err(PumpError::Write)?;
        }
        Ok(())
    }
}

async fn write_slice<W: AsyncWrite + Unpin>(
    dest: &Mutex<W>,
    bytes: &[u8],
) -> Result<(), PumpError> {
    if bytes.is_empty() {
        return Ok(());
    }
    write_run(dest, bytes).await.map_err(PumpError::Write)
}

async fn strike<C: AsyncWrite + Unpin>(
    strikes: &mut u8,
    client: &Mutex<C>,
    answer: &[u8],
) -> Result<(), PumpError> {
    write_run(client, answer).await.map_err(PumpError::Write)?;
    count_strike(strikes)
}

/// Counts a refused frame (already answered); the third ends the direction.
fn count_strike(strikes: &mut u8) -> Result<(), PumpError> {
    *strikes += 1;
    tracing::debug!(strikes = *strikes, "a frame was refused");
    if *strikes >= MAX_STRIKES {
        return Err(PumpError::TooManyStrikes);
    }
    Ok(())
}

/// Writes complete lines under the writer's lock, so frames from two sources never interleave.
pub async fn write_run<W: AsyncWrite + Unpin>(dest: &Mutex<W>, run: &[u8]) -> io::Result<()> {
    let mut w = dest.lock().await;
    w.write_all(run).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, duplex};

    #[tokio::test]
    async fn forwarded_bytes_are_identical_and_oversize_is_answered_to_the_client() {
        let (mut src_w, src_r) = duplex(1 << 20);
        let (dst_w, mut dst_r) = duplex(1 << 20);
        let (cli_w, mut cli_r) = duplex(1 << 20);
        let mut input = b"{\"id\":1, \"k\":\"\xe2\x9c\x93\"}\n".to_vec();
        input.extend(std::iter::repeat_n(b'a', 300));
        input.extend_from_slice(b"\n{\"id\" :2}\n");
        let feed = input.clone();
        tokio::spawn(async move { src_w.write_all(&feed).await });
        let mut reader = FrameReader::new(src_r, 200);
        let (dest, client) = (Mutex::new(dst_w), Mutex::new(cli_w));
        let mut seen = 0;
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            let _ = forward(
                &mut reader,
                &dest,
                &client,
                LongLines::PassOn,
                std::future::pending(),
                |run| seen += run.len(),
            )
            .await;
        })
        .await
        .ok();
        drop((dest, client));
        let mut out = Vec::new();
        dst_r.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"{\"id\":1, \"k\":\"\xe2\x9c\x93\"}\n{\"id\" :2}\n");
        assert_eq!(seen, out.len());
        let mut notice = Vec::new();
        cli_r.read_to_end(&mut notice).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&notice).unwrap();
        assert_eq!(v["error"]["code"], -32051);
        assert!(v["id"].is_null());
    }

    #[tokio::test]
    async fn a_long_answer_passes_through_while_it_arrives_and_is_observed_once() {
        use crate::transport::PASS_AT;
        let (mut src_w, src_r) = duplex(1 << 16);
        let (dst_w, mut dst_r) = duplex(1 << 16);
        let text = "\u{e9}\\\"}{".repeat(4 * PASS_AT / 8);
        let long = format!(
            "{{\"result\":{{\"content\":[{{\"text\":\"{text}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":41}}\n"
        );
        let pump = async move {
            let mut reader = FrameReader::new(src_r, crate::transport::MAX_FRAME);
            let (dest, client) = (Mutex::new(dst_w), Mutex::new(tokio::io::sink()));
            let mut seen = Vec::new();
            let r = forward(
                &mut reader,
                &dest,
                &client,
                LongLines::PassOn,
                std::future::pending(),
                |s| s.each_frame(|frame, len| seen.push((frame.to_vec(), len))),
            )
            .await;
            r.map(|()| seen)
        };
        let feed = async {
            // The head goes out before the source has written the rest: the node never waits
            // for the whole line.
            src_w
                .write_all(&long.as_bytes()[..2 * PASS_AT])
                .await
                .unwrap();
            let mut head = vec![0u8; PASS_AT];
            dst_r.read_exact(&mut head).await.unwrap();
            assert_eq!(head, long.as_bytes()[..PASS_AT]);
            src_w
                .write_all(&long.as_bytes()[2 * PASS_AT..])
                .await
                .unwrap();
            src_w
                .write_all(b"{\"id\":42,\"result\":{}}\n")
                .await
                .unwrap();
            drop(src_w);
            let mut rest = Vec::new();
            dst_r.read_to_end(&mut rest).await.unwrap();
            [head, rest].concat()
        };
        let (pumped, out) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::join!(pump, feed)
        })
        .await
        .unwrap();
        let seen = pumped.unwrap();
        assert_eq!(
            out,
            [long.as_bytes(), b"{\"id\":42,\"result\":{}}\n"].concat()
        );
        assert_eq!(seen.len(), 2);
        let first = crate::jsonrpc::peek_response(&seen[0].0).unwrap();
        assert_eq!(first.answers().unwrap().get(), "41");
        assert_eq!(seen[0].1, long.len());
    }

    #[tokio::test]
    async fn a_stopped_pump_ends_its_half_written_line_and_lets_go_of_its_writer() {
        use crate::transport::PASS_AT;
        let (mut src_w, src_r) = duplex(1 << 20);
        let (dst_w, mut dst_r) = duplex(1 << 20);
        let dest = Mutex::new(dst_w);
        let stop = tokio_util::sync::CancellationToken::new();
        // The head of a long line, and the rest never comes: the source stays open.
        src_w.write_all(&vec![b'x'; 2 * PASS_AT]).await.unwrap();
        let pump = async {
            let mut reader = FrameReader::new(src_r, crate::transport::MAX_FRAME);
            let mut seen = 0;
            let r = forward(
                &mut reader,
                &dest,
                &dest,
                LongLines::PassOn,
                stop.cancelled(),
                |s| seen += s.len(),
            )
            .await;
            r.map(|()| seen)
        };
        let after = async {
            let mut head = vec![0u8; PASS_AT];
            dst_r.read_exact(&mut head).await.unwrap();
            stop.cancel();
        };
        let (seen, ()) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::join!(pump, after)
        })
        .await
        .expect("the stopped pump ended");
        // Its writer is free again, and what is written now is a line of its own.
        write_run(&dest, b"{\"id\":1}\n").await.unwrap();
        drop(dest);
        let mut out = vec![0u8; PASS_AT];
        out.extend(read_all(&mut dst_r).await);
        let lines: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 2, "the ended line and the next one");
        assert_eq!(lines[1], b"{\"id\":1}\n");
        assert_eq!(seen.unwrap(), lines[0].len(), "the newline was seen too");
        drop(src_w);
    }

    async fn read_all(r: &mut (impl AsyncReadExt + Unpin)) -> Vec<u8> {
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    }

    /// Passes `start`, then three times `max` bytes of `x` (a line run past the cap), then
    /// `rest`, through a cut-through pump watched by `watch`; returns what it wrote.
    async fn cut_off(max: usize, start: &[u8], rest: &[u8], watch: &mut impl Observer) -> Vec<u8> {
        let (mut src_w, src_r) = duplex(1 << 16);
        let (dst_w, mut dst_r) = duplex(1 << 20);
        let mut input = start.to_vec();
        input.extend(vec![b'x'; 3 * max]);
        input.extend_from_slice(rest);
        tokio::spawn(async move { src_w.write_all(&input).await.unwrap() });
        let mut reader = FrameReader::new(src_r, max);
        let dest = Mutex::new(dst_w);
        forward_observed(
            &mut reader,
            &dest,
            &dest,
            LongLines::PassOn,
            std::future::pending(),
            watch,
        )
        .await
        .unwrap();
        drop(dest);
        let mut out = Vec::new();
        dst_r.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_long_answer_past_the_cap_is_ended_and_its_request_answered_in_the_same_stream() {
        use crate::transport::PASS_AT;
        let max = 2 * PASS_AT;
        for (start, id) in [
            (
                &br#"{"jsonrpc":"2.0","id":"r-7","result":{"text":""#[..],
                "\"r-7\"",
            ),
            // A line that never named a request is answered with id null.
            (&br#"{"jsonrpc":"2.0","result":{"text":""#[..], "null"),
        ] {
            let (mut seen, mut counted) = (Vec::new(), 0);
            let mut watch = Watch(|s: Seen<'_>| {
                counted += s.len();
                s.each_frame(|line, _| seen.push(line.to_vec()))
            });
            let out = cut_off(max, start, b"\"}}\n{\"id\":1}\n", &mut watch).await;
            let lines: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
            assert_eq!(lines.len(), 3, "the cut line, its answer, the next line");
            assert!(lines[0].len() <= max + 1 && lines[0].ends_with(b"\n"));
            let v: serde_json::Value = serde_json::from_slice(lines[1]).unwrap();
            assert_eq!(v["error"]["code"], -32051);
            assert_eq!(v["id"].to_string(), id);
            assert_eq!(lines[2], b"{\"id\":1}\n");
            // The observer saw the answer, so a ledger sees the request end.
            assert_eq!(seen.len(), 2, "{seen:?}");
            assert_eq!(seen[0], lines[1].trim_ascii_end());
            assert_eq!(
                counted,
                out.len(),
                "every byte written was seen, the cut part too"
            );
        }
    }

    /// Watches like a serving node's ledger with one request waiting (`lone`), or several.
    struct OneWaiting {
        lone: Option<&'static str>,
        frames: Vec<Vec<u8>>,
    }

    impl Observer for OneWaiting {
        fn seen(&mut self, seen: Seen<'_>) {
            seen.each_frame(|line, _| self.frames.push(line.to_vec()));
        }

        fn lone_pending(&mut self) -> Option<Box<RawValue>> {
            self.lone
                .and_then(|id| RawValue::from_string(id.into()).ok())
        }
    }

    #[tokio::test]
    async fn an_answer_cut_before_its_id_went_by_answers_the_one_request_waiting() {
        use crate::transport::PASS_AT;
        let max = 2 * PASS_AT;
        for (start, lone, id) in [
            // The TypeScript SDK writes `result` (or `error`) before `id`.
            (&br#"{"result":{"text":""#[..], Some("\"r-9\""), "\"r-9\""),
            (&br#"{"error":{"code":-1,"message":""#[..], Some("7"), "7"),
            // Several requests waiting: any of them could be the one.
            (&br#"{"result":{"text":""#[..], None, "null"),
            // A request from the server (its params first) answers no request of the client's.
            (&br#"{"params":{"text":""#[..], Some("\"r-9\""), "null"),
            // An id that went by before the cut is the one answered.
            (
                &br#"{"id":"r-7","result":{"text":""#[..],
                Some("\"r-9\""),
                "\"r-7\"",
            ),
        ] {
            let mut watch = OneWaiting {
                lone,
                frames: Vec::new(),
            };
            let out = cut_off(max, start, b"", &mut watch).await;
            let lines: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
            assert_eq!(lines.len(), 2, "the cut line and its answer");
            let v: serde_json::Value = serde_json::from_slice(lines[1]).unwrap();
            assert_eq!(v["error"]["code"], -32051);
            let start = String::from_utf8_lossy(start);
            assert_eq!(v["id"].to_string(), id, "after {start}");
            assert_eq!(watch.frames, [lines[1].trim_ascii_end()], "after {start}");
        }
    }

    /// Holds while `holding`, and rewrites lines that start with `{"edit"` to `{"edited":1}`.
    struct Editor {
        holding: bool,
        seen: Vec<u8>,
    }

    impl Observer for Editor {
        fn seen(&mut self, seen: Seen<'_>) {
            if let Seen::Lines(run) = seen {
                self.seen.extend_from_slice(run);
            }
        }

        fn holding(&mut self) -> bool {
            self.holding
        }

        fn rewrite(&mut self, line: &[u8]) -> Option<Vec<u8>> {
            assert!(self.holding, "rewrite is asked only while holding");
            line.starts_with(b"{\"edit\"")
                .then(|| b"{\"edited\":1}".to_vec())
        }
    }

    #[tokio::test]
    async fn a_holding_observer_rewrites_whole_lines_long_ones_too_and_nothing_else() {
        use crate::transport::PASS_AT;
        let long_edit = format!("{{\"edit\":\"{}\"}}\n", "e".repeat(2 * PASS_AT));
        let long_kept = format!("{{\"keep\":\"{}\"}}\r\n", "k".repeat(2 * PASS_AT));
        let mut input = b"{\"keep\" : 1}\n{\"edit\":2}\r\n\n".to_vec();
        input.extend_from_slice(long_edit.as_bytes());
        input.extend_from_slice(long_kept.as_bytes());
        input.extend_from_slice(b"{\"edit\":3}");
        for holding in [true, false] {
            let (mut src_w, src_r) = duplex(1 << 20);
            let (dst_w, mut dst_r) = duplex(1 << 22);
            let feed = input.clone();
            tokio::spawn(async move { src_w.write_all(&feed).await });
            let mut reader = FrameReader::new(src_r, crate::transport::MAX_FRAME);
            let dest = Mutex::new(dst_w);
            let mut editor = Editor {
                holding,
                seen: Vec::new(),
            };
            forward_observed(
                &mut reader,
                &dest,
                &dest,
                LongLines::PassOn,
                std::future::pending(),
                &mut editor,
            )
            .await
            .unwrap();
            drop(dest);
            let out = read_all(&mut dst_r).await;
            if holding {
                let mut want = b"{\"keep\" : 1}\n{\"edited\":1}\n\n{\"edited\":1}\n".to_vec();
                want.extend_from_slice(long_kept.as_bytes());
                want.extend_from_slice(b"{\"edited\":1}\n");
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&want)
                );
                assert_eq!(editor.seen, out, "the observer saw what went on");
            } else {
                assert_eq!(out, input, "nothing held, nothing edited");
            }
        }
    }

    #[tokio::test]
    async fn checked_forwarding_drops_only_the_refused_lines_and_answers_them() {
        let (mut src_w, src_r) = duplex(1 << 16);
        let (dst_w, mut dst_r) = duplex(1 << 16);
        let (cli_w, mut cli_r) = duplex(1 << 16);
        src_w
            .write_all(b"{\"ok\":1}\n{\"no\":2}\n\n{\"ok\":3}\r\n")
            .await
            .unwrap();
        drop(src_w);
        let mut reader = FrameReader::new(src_r, 1024);
        let (dest, client) = (Mutex::new(dst_w), Mutex::new(cli_w));
        forward_checked(
            &mut reader,
            &dest,
            &client,
            |line| {
                if line.starts_with(b"{\"no\"") {
                    Verdict::Answer(b"refused\n".to_vec())
                } else {
                    Verdict::Forward
                }
            },
            None,
        )
        .await
        .unwrap();
        drop((dest, client));
        let (mut out, mut answers) = (Vec::new(), Vec::new());
        dst_r.read_to_end(&mut out).await.unwrap();
        cli_r.read_to_end(&mut answers).await.unwrap();
        assert_eq!(
            out, b"{\"ok\":1}\n\n{\"ok\":3}\r\n",
            "kept lines are byte-identical"
        );
        assert_eq!(answers, b"refused\n");
    }

    #[tokio::test]
    async fn the_third_strike_ends_the_direction() {
        let (mut src_w, src_r) = duplex(1 << 16);
        let big = [vec![b'z'; 50], b"\n".to_vec()].concat().repeat(3);
        tokio::spawn(async move {
            src_w.write_all(&big).await.unwrap();
            // Keep the source open: only the strikes may end the pump.
            std::future::pending::<()>().await;
        });
        let mut reader = FrameReader::new(src_r, 10);
        let (dest, client) = (Mutex::new(tokio::io::sink()), Mutex::new(tokio::io::sink()));
        let r = forward(
            &mut reader,
            &dest,
            &client,
            LongLines::FromClient,
            std::future::pending(),
            |_| {},
        )
        .await;
        assert!(matches!(r, Err(PumpError::TooManyStrikes)));
    }

    /// A [`DecideLong`] from a closure, letting every long line pass.
    struct Passes<F>(F);

    impl<F: FnMut(Scanned, usize) -> Verdict + Send> DecideLong for Passes<F> {
        fn may_pass(&mut self) -> bool {
            true
        }
        fn foresee(&mut self, _: &Scan) -> Option<bool> {
            Some(true)
        }
        fn decide(&mut self, scanned: Scanned, len: usize) -> Verdict {
            (self.0)(scanned, len)
        }
    }

    /// A call whose arguments make it `size` bytes long (without its newline).
    fn long_call(id: u32, tool: &str, size: usize) -> Vec<u8> {
        let head = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"text":""#
        );
        let tail = br#""}}}"#;
        let fill = size - head.len() - tail.len();
        [head.as_bytes(), &vec![b'x'; fill], tail].concat()
    }

    /// Runs a checked pump over `input` with `decide` for long lines; what reached the server,
    /// what the client was answered, and how each long line was seen.
    async fn checked(
        input: Vec<u8>,
        max: usize,
        verdict: impl Fn(&crate::scan::Gist) -> Verdict + Send + Sync,
    ) -> (Vec<u8>, Vec<u8>, Vec<String>) {
        let mut seen = Vec::new();
        let mut decide = Passes(|scanned: Scanned, len: usize| {
            seen.push(format!("{len} {}", matches!(scanned, Scanned::Object(_))));
            match scanned {
                Scanned::Object(gist) => verdict(&gist),
                _ => Verdict::Strike(b"bad\n".to_vec()),
            }
        });
        let (out, answers) = pumped(input, max, |_| Verdict::Forward, &mut decide).await;
        (out, answers, seen)
    }

    /// Runs a checked pump over `input`; what reached the server and what the client was
    /// answered.
    async fn pumped(
        input: Vec<u8>,
        max: usize,
        check: impl FnMut(&[u8]) -> Verdict,
        decide: &mut dyn DecideLong,
    ) -> (Vec<u8>, Vec<u8>) {
        let (mut src_w, src_r) = duplex(1 << 16);
        let (dst_w, mut dst_r) = duplex(1 << 16);
        let (cli_w, mut cli_r) = duplex(1 << 16);
        let feed = tokio::spawn(async move { src_w.write_all(&input).await.unwrap() });
        let read = tokio::spawn(async move {
            let mut out = Vec::new();
            dst_r.read_to_end(&mut out).await.unwrap();
            out
        });
        let mut reader = FrameReader::new(src_r, max);
        let (dest, client) = (Mutex::new(dst_w), Mutex::new(cli_w));
        let r = forward_checked(&mut reader, &dest, &client, check, Some(decide)).await;
        assert!(r.is_ok(), "{r:?}");
        feed.await.unwrap();
        drop((dest, client));
        let mut answers = Vec::new();
        cli_r.read_to_end(&mut answers).await.unwrap();
        (read.await.unwrap(), answers)
    }

    /// A [`DecideLong`] whose look ahead holds a call of the tool `no`, lets one of `yes` go
    /// and cannot tell any other start; it keeps the length and the tool of each line it
    /// decided on.
    #[derive(Default)]
    struct Looks(Vec<(usize, Option<String>)>);

    impl DecideLong for Looks {
        fn may_pass(&mut self) -> bool {
            true
        }
        fn foresee(&mut self, scan: &Scan) -> Option<bool> {
            let ahead = scan.ahead();
            let peek = crate::jsonrpc::peek(&ahead)?;
            let tool = peek.params.and_then(crate::jsonrpc::subject_name)?;
            match tool.as_str() {
                "no" => Some(false),
                "yes" => Some(true),
                _ => None,
            }
        }
        fn decide(&mut self, scanned: Scanned, len: usize) -> Verdict {
            let Scanned::Object(gist) = scanned else {
                self.0.push((len, None));
                return Verdict::Strike(b"bad\n".to_vec());
            };
            let peek = crate::jsonrpc::peek(&gist.object);
            let tool = peek.and_then(|p| p.params.and_then(crate::jsonrpc::subject_name));
            self.0.push((len, tool));
            Verdict::Forward
        }
    }

    #[tokio::test]
    async fn a_long_request_whose_start_would_be_refused_is_held_whole_and_never_reaches_the_server()
     {
        let size = 2 * LOOK_AHEAD;
        let (no, ok) = (long_call(1, "no", size), long_call(2, "ok", size));
        let yes = long_call(4, "yes", size);
        let input = [&no[..], b"\n", &ok, b"\n{\"id\":3}\n", &yes, b"\n"].concat();
        let mut checked = Vec::new();
        let check = |line: &[u8]| {
            checked.push(line.len());
            match line.windows(5).any(|w| w == br#""no","#) {
                true => Verdict::Answer(b"refused\n".to_vec()),
                false => Verdict::Forward,
            }
        };
        let mut looks = Looks::default();
        let (out, answers) = pumped(input, 1 << 20, check, &mut looks).await;
        // The held call was checked whole and answered; `ok` went on undecided after the look
        // ahead, `yes` once its start named it, and each was decided on, as scanned whole,
        // when it ended.
        assert_eq!(out, [&ok[..], b"\n{\"id\":3}\n", &yes, b"\n"].concat());
        assert_eq!(answers, b"refused\n");
        assert_eq!(checked, [no.len(), b"{\"id\":3}".len()]);
        let tool = |t: &str| Some(t.to_string());
        assert_eq!(
            looks.0,
            [(ok.len() + 1, tool("ok")), (yes.len() + 1, tool("yes"))]
        );
    }

    #[tokio::test]
    async fn a_long_line_that_breaks_while_its_start_is_looked_at_stops_where_it_breaks() {
        let size = 2 * LOOK_AHEAD;
        let mut bad = long_call(1, "echo", size);
        // Its arguments first, so the look ahead cannot tell it before the break.
        let named = br#""name":"echo","#;
        let at = memchr::memmem::find(&bad, named).unwrap();
        bad.drain(at..at + named.len());
        let end = bad.len() - 2;
        bad.splice(end..end, *br#","name":"echo""#);
        let broken_at = LOOK_AHEAD / 2;
        bad.splice(broken_at..broken_at, *b"\" /* \"");
        let mut looks = Looks::default();
        let input = [&bad[..], b"\n{\"id\":2}\n"].concat();
        let (out, answers) = pumped(input, 1 << 20, |_| Verdict::Forward, &mut looks).await;
        let first = out.split(|b| *b == b'\n').next().unwrap();
        assert!(
            first.len() <= broken_at + 3 && bad.starts_with(first),
            "nothing past the break: {} bytes went on",
            first.len()
        );
        // What was looked at before the part it broke in (parts are at most the pipe's 64 KiB)
        // went on.
        assert!(first.len() + (1 << 16) > broken_at, "{}", first.len());
        assert!(out.ends_with(b"\n{\"id\":2}\n"));
        assert_eq!(answers, b"bad\n");
        assert_eq!(looks.0, [(bad.len() + 1, None)]);
    }

    #[tokio::test]
    async fn a_long_request_goes_on_as_it_arrives_and_only_its_close_waits_for_the_verdict() {
        let (mut src_w, src_r) = duplex(1 << 16);
        let (dst_w, mut dst_r) = duplex(1 << 20);
        let line = long_call(1, "echo", 4 * crate::transport::PASS_AT);
        let (head, rest) = line.split_at(line.len() - 10);
        let mut reader = FrameReader::new(src_r, 1 << 20);
        let (dest, client) = (Mutex::new(dst_w), Mutex::new(tokio::io::sink()));
        let mut decided = Vec::new();
        let mut decide = Passes(|scanned: Scanned, len: usize| {
            decided.push((matches!(scanned, Scanned::Object(_)), len));
            Verdict::Forward
        });
        let pump = forward_checked(
            &mut reader,
            &dest,
            &client,
            |_| Verdict::Forward,
            Some(&mut decide),
        );
        let mut got = vec![0u8; head.len()];
        let reading = async {
            src_w.write_all(head).await.unwrap();
            // All the line's bytes but its last ten are at the server before they were sent.
            dst_r.read_exact(&mut got).await.unwrap();
            src_w.write_all(rest).await.unwrap();
            src_w.write_all(b"\n{\"id\":2}\n").await.unwrap();
            drop(src_w);
        };
        // Bounded: a pump that held the line's start back would leave the reader waiting.
        let (r, ()) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            tokio::join!(pump, reading)
        })
        .await
        .expect("the line's start reached the server before its close was sent");
        assert!(r.is_ok());
        drop(dest);
        let mut tail = Vec::new();
        dst_r.read_to_end(&mut tail).await.unwrap();
        assert_eq!(got, head);
        assert_eq!(tail, [rest, b"\n{\"id\":2}\n"].concat());
        assert_eq!(decided, [(true, line.len() + 1)]);
    }

    #[tokio::test]
    async fn a_refused_long_request_reaches_the_server_without_its_close() {
        let size = 3 * crate::transport::PASS_AT;
        let input = [
            long_call(1, "no", size),
            b"\n".to_vec(),
            long_call(2, "ok", size),
            b"\n{\"id\":3}\n".to_vec(),
        ]
        .concat();
        let (out, answers, seen) = checked(input, 1 << 20, |gist| {
            let peek = crate::jsonrpc::peek(&gist.object).unwrap();
            match peek
                .params
                .and_then(crate::jsonrpc::subject_name)
                .as_deref()
            {
                Some("ok") => Verdict::Forward,
                _ => Verdict::Answer(b"refused\n".to_vec()),
            }
        })
        .await;
        let lines: Vec<&[u8]> = out.split(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 4, "three lines and the end");
        let refused = long_call(1, "no", size);
        assert_eq!(
            lines[0],
            &refused[..refused.len() - 1],
            "all of it but its last bracket"
        );
        assert!(serde_json::from_slice::<serde_json::Value>(lines[0]).is_err());
        assert_eq!(lines[1], long_call(2, "ok", size));
        assert_eq!(lines[2], b"{\"id\":3}");
        assert_eq!(answers, b"refused\n");
        assert_eq!(
            seen,
            [format!("{} true", size + 1), format!("{} true", size + 1)]
        );
    }

    #[tokio::test]
    async fn a_long_line_that_is_not_json_stops_where_it_breaks_and_is_struck() {
        let size = 3 * crate::transport::PASS_AT;
        let mut bad = long_call(1, "echo", size);
        let at = 2 * crate::transport::PASS_AT;
        bad.splice(at..at, *b"\"} /* \"");
        let input = [bad.clone(), b"\n{\"id\":2}\n".to_vec()].concat();
        let (out, answers, seen) = checked(input, 1 << 20, |_| Verdict::Forward).await;
        let first = out.split(|b| *b == b'\n').next().unwrap();
        assert!(
            first.len() <= at + 3 && bad.starts_with(first),
            "nothing past the break"
        );
        assert!(out.ends_with(b"\n{\"id\":2}\n"));
        assert_eq!(answers, b"bad\n");
        assert_eq!(seen, [format!("{} false", bad.len() + 1)]);
    }

    #[tokio::test]
    async fn a_long_request_past_the_cap_is_ended_there_and_answered_with_its_id() {
        let max = 3 * crate::transport::PASS_AT;
        let input = [long_call(9, "echo", 2 * max), b"\n{\"id\":2}\n".to_vec()].concat();
        let (out, answers, seen) = checked(input, max, |_| Verdict::Forward).await;
        let first = out.split(|b| *b == b'\n').next().unwrap();
        assert!(first.len() <= max, "{}", first.len());
        assert!(out.ends_with(b"\n{\"id\":2}\n"));
        let answer: serde_json::Value = serde_json::from_slice(&answers).unwrap();
        assert_eq!(answer["id"], 9);
        assert_eq!(answer["error"]["code"], -32051);
        assert!(seen.is_empty(), "the cut line is not decided on");
    }
}
