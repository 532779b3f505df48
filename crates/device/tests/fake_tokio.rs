//! The pattern of `examples/tokio_service.rs`, smaller, on the fake driver: 200 tasks on a
//! tokio runtime of 2 worker threads, each sending requests through two queues (write, copy
//! through a command buffer, read back, ordered by the task's semaphore) and awaiting them with
//! `wait_async`; every result is checked, and nothing stays registered on the semaphores.

mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use cuhal::{Buffer, CommandBuffer, Device, HostBuffer, Semaphore};
use fake_support::*;

const TASKS: usize = 200;
const REQUESTS: usize = 5;
const BYTES: usize = 64;

struct Task {
    queue: usize,
    buffer: Arc<Buffer>,
    copy: Arc<dyn CommandBuffer>,
    host: Arc<HostBuffer>,
    timeline: Semaphore,
}

fn task(device: &Device, index: usize) -> Task {
    let queue = index % device.queues().len();
    let buffer = device.create_buffer(2 * BYTES).unwrap();
    let mut cb = device.queue(queue).create_command_buffer().unwrap();
    cb.copy(
        &buffer.range(0, BYTES).unwrap(),
        &buffer.range(BYTES, BYTES).unwrap(),
    )
    .unwrap();
    Task {
        queue,
        buffer,
        copy: cb.end().unwrap(),
        host: device.create_host_buffer(BYTES).unwrap(),
        timeline: device.create_semaphore(0),
    }
}

/// Request-unique bytes.
fn payload(task: usize, request: usize) -> Vec<u8> {
    (0..BYTES)
        .map(|i| (task * 31 + request * 7 + i) as u8)
        .collect()
}

/// One request: submitted, awaited, checked.
async fn request(device: &Device, task: &Task, index: usize, request: usize) {
    let queue = device.queue(task.queue);
    let t = &task.timeline;
    let base = 3 * request as u64;
    let sent = payload(index, request);
    queue
        .write(
            &[(t, base)],
            &[(t, base + 1)],
            &task.buffer.range(0, BYTES).unwrap(),
            &sent,
        )
        .unwrap();
    queue
        .execute(&[(t, base + 1)], &[(t, base + 2)], &[&task.copy])
        .unwrap();
    queue
        .read(
            &[(t, base + 2)],
            &[(t, base + 3)],
            &task.buffer.range(BYTES, BYTES).unwrap(),
            &task.host,
            0,
        )
        .unwrap();
    t.wait_async(base + 3).await.unwrap();
    let mut got = vec![0u8; BYTES];
    task.host.read(0, &mut got).unwrap();
    assert_eq!(got, sent, "task {index}, request {request}");
}

#[test]
fn two_hundred_tokio_tasks_await_their_gpu_work() {
    let (fake, _driver, device) = open("tokio", queues(2));
    // Each copy keeps its queue's stream busy for a while: most futures are pending when first
    // polled, and the completion sides wake them.
    fake.set_timing(Duration::from_micros(300), Duration::ZERO);
    let device = Arc::new(device);
    let tasks: Vec<Arc<Task>> = (0..TASKS).map(|i| Arc::new(task(&device, i))).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let done = runtime.block_on(async {
        let handles: Vec<_> = tasks
            .iter()
            .enumerate()
            .map(|(index, task)| {
                let (device, task) = (device.clone(), task.clone());
                tokio::spawn(async move {
                    for r in 0..REQUESTS {
                        request(&device, &task, index, r).await;
                    }
                    index
                })
            })
            .collect();
        let mut done = Vec::new();
        for handle in handles {
            done.push(handle.await.unwrap());
        }
        done
    });
    assert_eq!(done, (0..TASKS).collect::<Vec<_>>());
    for task in &tasks {
        assert_eq!(task.timeline.query().unwrap(), 3 * REQUESTS as u64);
        assert_eq!(task.timeline.listener_count(), 0);
        assert!(!task.timeline.has_waiters());
    }
    for queue in device.queues() {
        settle(queue);
    }
    fake.set_timing(Duration::ZERO, Duration::ZERO);
}
