//! Inbound bridges: what the remote sends is a record before the remote is
//! acknowledged, so kill -9 of saguin loses nothing the remote handed it.

mod bridge_support;
mod broker_support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use bridge_support::{have_mosquitto, read_channel, saguin_yaml, Mosquitto, Rng};
use broker_support::{v4, Broker, ConnectOpts, Raw};

const PUBLISHERS: usize = 4;

async fn publish_to_remote(remote: SocketAddr, p: usize, seqs: std::ops::Range<u32>) {
    let mut c = Raw::tcp(remote, v4()).await;
    c.connect(&format!("remote-pub{p}"), ConnectOpts::clean())
        .await;
    let mut id = 1u16;
    for seq in seqs {
        c.publish_acked(
            &format!("sites/17/cmd/d{p}"),
            format!("{p}:{seq}").as_bytes(),
            1,
            false,
            id,
        )
        .await;
        id = id % 60_000 + 1;
    }
    c.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_every_message_the_remote_handed_over_is_a_record_through_kill_9() {
    if !have_mosquitto("in_kill_9") {
        return;
    }
    let mut rng = Rng::seeded("in_kill_9");
    let remote = Mosquitto::start("log_type subscribe");
    let dir = tempfile::tempdir().unwrap();
    let yaml = saguin_yaml(
        dir.path(),
        "  - { name: commands, kind: append, storage: db }",
        &format!(
            "  - name: cloud
    address: {}
    client_id: site17.cloud
    reconnect: {{ base: 50ms, cap: 400ms }}
    in: [{{ filter: sites/17/cmd/#, remote_prefix: sites/17/, local_prefix: commands/, qos: 1 }}]
",
            remote.addr()
        ),
    );
    let mut saguin = Broker::start_in(dir, &yaml);
    // The remote holds the bridge's subscription before anything is sent:
    // from then on it keeps what it has not handed over.
    tokio::task::block_in_place(|| {
        remote.wait_log(|l| l.contains("site17.cloud 1 sites/17/cmd/#"))
    });
    let rounds = 5u32;
    let per_round = 500u32;
    for round in 0..rounds {
        let range = round * per_round..(round + 1) * per_round;
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| tokio::spawn(publish_to_remote(remote.addr(), p, range.clone())))
            .collect();
        // kill -9 while the remote is handing the round over.
        if round + 1 < rounds {
            let wanted = 1 + rng.below(u64::from(per_round)) as usize;
            let addr = saguin.addr();
            read_channel(addr, "commands/#", Duration::from_secs(60), |seen| {
                seen.iter()
                    .filter(|(_, p)| round_of(p, per_round) == round)
                    .count()
                    >= wanted
            })
            .await;
            for p in publishers {
                p.await.unwrap();
            }
            saguin = saguin.restart(&yaml);
        } else {
            for p in publishers {
                p.await.unwrap();
            }
        }
    }
    let total = (rounds * per_round) as usize * PUBLISHERS;
    let seen = read_channel(
        saguin.addr(),
        "commands/#",
        Duration::from_secs(120),
        |seen| {
            seen.iter()
                .map(|(_, p)| p.clone())
                .collect::<HashSet<_>>()
                .len()
                == total
        },
    )
    .await;
    let distinct: HashSet<&Vec<u8>> = seen.iter().map(|(_, p)| p).collect();
    assert_eq!(distinct.len(), total, "records missing in the channel");
    for (topic, payload) in &seen {
        let p = std::str::from_utf8(payload)
            .unwrap()
            .split(':')
            .next()
            .unwrap();
        assert_eq!(topic, &format!("commands/cmd/d{p}"));
    }
    eprintln!(
        "in_kill_9: {total} messages, {} records ({} duplicates)",
        seen.len(),
        seen.len() - total
    );
}

fn round_of(payload: &[u8], per_round: u32) -> u32 {
    let text = std::str::from_utf8(payload).unwrap();
    let seq: u32 = text.split(':').nth(1).unwrap().parse().unwrap();
    seq / per_round
}
