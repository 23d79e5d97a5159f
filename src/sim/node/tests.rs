//! Tests of `node`.

use super::*;

/// A cup-pos node that answers after `delay`.
async fn delayed_node(delay: &str) -> (Arc<Spec>, NodeSim) {
    let spec = Arc::new(Spec::builtin("cup-pos").unwrap());
    let mut cfg = NodeSimConfig::new("01");
    cfg.delay = Delay::parse(delay).unwrap();
    let node = NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
        .await
        .unwrap();
    (spec, node)
}

/// `n` sample 0200s for `spec`, each behind its length prefix.
fn purchases(spec: &Spec, n: usize) -> bytes::BytesMut {
    let request = crate::sim::sample_request(spec, "0200").unwrap();
    let mut frames = bytes::BytesMut::new();
    for _ in 0..n {
        spec.framing()
            .prefix
            .encode(request.len(), &mut frames)
            .unwrap();
        frames.extend_from_slice(&request);
    }
    frames
}

/// Stopping a node closes its connections at once, as a dying process
/// does: answers it was still delaying are not sent (their tasks used to
/// keep the writer, and so the connection, open until they had run).
#[tokio::test]
async fn stop_closes_every_connection_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (spec, node) = delayed_node("500ms").await;
    let mut client = TcpStream::connect(node.addr).await.unwrap();
    client.write_all(&purchases(&spec, 1)).await.unwrap();
    while node.stats.requests.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    node.stop().await;
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_millis(200), client.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "closed at once, no late answer: {read:?}"
    );
}

/// Delayed answers are bounded: past MAX_DELAYED waiting, a request is
/// counted unanswered instead of holding one more task (it used to spawn
/// one per request without limit).
#[tokio::test]
async fn delayed_answers_past_the_cap_are_counted_unanswered() {
    use tokio::io::AsyncWriteExt;
    tokio::time::timeout(Duration::from_secs(30), async {
        let (spec, node) = delayed_node("60s").await;
        let mut client = TcpStream::connect(node.addr).await.unwrap();
        let over = 3;
        let frames = purchases(&spec, super::super::MAX_DELAYED + over);
        client.write_all(&frames).await.unwrap();
        let total = (super::super::MAX_DELAYED + over) as u64;
        while node.stats.requests.load(Ordering::Relaxed) < total {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(node.stats.unanswered.load(Ordering::Relaxed), over as u64);
        assert_eq!(
            node.stats.answered.load(Ordering::Relaxed),
            super::super::MAX_DELAYED as u64
        );
        node.stop().await;
    })
    .await
    .expect("within the test's time");
}

/// Behind F37 stamping (and across switch instances) the answer to a
/// node-originated request comes back on whichever connection the
/// switch holds: matched by STAN all the same, counted as elsewhere; a
/// second answer is foreign.
#[tokio::test]
async fn an_originated_answer_on_another_connection_is_matched() {
    use tokio::io::AsyncWriteExt;
    tokio::time::timeout(Duration::from_secs(20), async {
        let spec = Arc::new(Spec::builtin("cups").unwrap());
        let mut cfg = NodeSimConfig::new("03");
        cfg.originate = Some(Originate {
            mti: "0200".into(),
            rate: 20.0,
            stan_base: 300_000,
            timeout: Duration::from_secs(10),
        });
        let node = NodeSim::start("127.0.0.1:0".parse().unwrap(), spec.clone(), cfg)
            .await
            .unwrap();
        let framing = spec.framing();
        let mut conns = Vec::new();
        for _ in 0..2 {
            let s = TcpStream::connect(node.addr).await.unwrap();
            let (r, w) = s.into_split();
            conns.push((
                FramedRead::new(r, FrameCodec::new(framing.prefix, framing.max_frame)),
                w,
            ));
        }
        // The first originated request, on whichever connection it left.
        let (request, came_on) = loop {
            let (a, b) = conns.split_at_mut(1);
            let got = tokio::select! {
                f = a[0].0.next() => (f, 0),
                f = b[0].0.next() => (f, 1),
            };
            if let (Some(Ok(Frame::Message(p))), i) = got {
                break (p, i);
            }
        };
        let mut d = Message::parse(&spec, request).unwrap().decode().unwrap();
        d.mti = crate::sim::answer::response_mti(d.mti).unwrap();
        d.set_text(39, "00");
        let answer = spec.encode(&d).unwrap();
        let mut frame = bytes::BytesMut::new();
        framing.prefix.encode(answer.len(), &mut frame).unwrap();
        frame.extend_from_slice(&answer);
        let other = &mut conns[1 - came_on].1;
        other.write_all(&frame).await.unwrap();
        other.write_all(&frame).await.unwrap();
        let s = &node.stats;
        while s.foreign_responses.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(s.originated_answered.load(Ordering::Relaxed), 1);
        assert_eq!(s.originated_answered_elsewhere.load(Ordering::Relaxed), 1);
        assert_eq!(
            s.foreign_responses.load(Ordering::Relaxed),
            1,
            "the second answer"
        );
        node.stop().await;
    })
    .await
    .expect("within the test's time limit");
}

#[test]
fn delay_forms() {
    assert_eq!(
        Delay::parse("5ms").unwrap(),
        Delay {
            min: Duration::from_millis(5),
            max: Duration::from_millis(5)
        }
    );
    let r = Delay::parse("0..2s").unwrap();
    assert_eq!((r.min, r.max), (Duration::ZERO, Duration::from_secs(2)));
    let r = Delay::parse("10ms..200ms").unwrap();
    assert_eq!(
        (r.min, r.max),
        (Duration::from_millis(10), Duration::from_millis(200))
    );
    let r = Delay::parse("100..300ms").unwrap();
    assert_eq!(
        (r.min, r.max),
        (Duration::from_millis(100), Duration::from_millis(300))
    );
    assert!(Delay::parse("2s..1s").is_err());
    assert!(Delay::parse("soon").is_err());
    let mut rng = Rng::new(7);
    for _ in 0..100 {
        let d = r.sample(&mut rng);
        assert!(d >= r.min && d <= r.max);
    }
}
