mod fake_support;
use cuhal::{CommandBuffer, Device, FillPattern};
use fake_support::*;
use std::sync::Arc;
use std::time::Duration;

fn command_buffer(device: &Device, q: usize) -> Arc<dyn CommandBuffer> {
    let buffer = device.create_buffer(256).unwrap();
    let mut cb = device.queue(q).create_command_buffer().unwrap();
    cb.fill(&buffer.whole(), FillPattern::U32(5)).unwrap();
    cb.end().unwrap()
}

#[test]
fn prof_chain() {
    let (fake, _driver, device) = open("prof", queues(2));
    let cbs: Vec<_> = (0..2).map(|q| command_buffer(&device, q)).collect();
    let host = device.create_semaphore(0);
    let chain = device.create_semaphore(0);
    fake.set_timing(Duration::from_micros(3), Duration::from_micros(2));
    let steps = 100u64;
    for c in 0..300u64 {
        for i in 0..steps {
            let q = (i % 2) as usize;
            let v = c * steps + i;
            if i == 0 {
                device
                    .queue(q)
                    .execute(&[(&host, c + 1)], &[(&chain, v + 1)], &[&cbs[q]])
                    .unwrap();
            } else {
                device
                    .queue(q)
                    .execute(&[(&chain, v)], &[(&chain, v + 1)], &[&cbs[q]])
                    .unwrap();
            }
        }
        host.signal(c + 1).unwrap();
        wait(&chain, (c + 1) * steps);
    }
}
