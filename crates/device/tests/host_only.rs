//! What the device crate does without any driver: its error type, the lost flag, the options,
//! and host waits on its semaphores (a `cuhal::Semaphore` signalled only by the host needs no
//! event, so no driver).

use cuhal_sys::cu_name;
use std::time::{Duration, Instant};

use cuhal::{
    CommandBufferMode, DeviceOptions, Error, Failure, Semaphore, Verbosity, WaitMode,
    cuda_of_failure, wait_semaphores,
};
use cuhal_sys::CUresult;

fn cuda(call: &'static str, result: CUresult, name: &str) -> cuhal_sys::Error {
    cuhal_sys::Error::Cuda {
        call,
        result,
        name: name.into(),
        description: "described by the driver".into(),
    }
}

fn launch_failed() -> cuhal_sys::Error {
    cuda(
        cu_name!(cuEventSynchronize),
        CUresult::ERROR_LAUNCH_FAILED,
        "CUDA_ERROR_LAUNCH_FAILED",
    )
}

fn invalid_value() -> cuhal_sys::Error {
    cuda(
        cu_name!(cuMemsetD32Async),
        CUresult::ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE",
    )
}

#[test]
fn errors_find_the_driver_error_through_every_wrapper() {
    let root = launch_failed();
    let wrapped = [
        Failure::new(root.clone()),
        Failure::new(Error::Driver(root.clone())),
        Failure::new(cuhal_command::Error::Cuda(root.clone())),
        Failure::new(Error::Command(cuhal_command::Error::Cuda(root.clone()))),
    ];
    for failure in &wrapped {
        assert_eq!(cuda_of_failure(failure), Some(&root), "{failure}");
        let lost = Error::Lost(failure.clone());
        assert_eq!(lost.cuda(), Some(&root));
        assert!(lost.failure().is_some_and(|f| f.ptr_eq(failure)));
        assert!(lost.to_string().contains("lost"), "{lost}");
        assert!(
            lost.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"),
            "{lost}"
        );
        let failed = Error::Semaphore(cuhal_semaphore::Error::Failed(failure.clone()));
        assert_eq!(failed.cuda(), Some(&root));
        let queue = Error::Queue(cuhal_scheduler::Error::Lost {
            queue: "q".into(),
            failure: failure.clone(),
        });
        assert_eq!(queue.cuda(), Some(&root));
        assert!(queue.failure().is_some_and(|f| f.ptr_eq(failure)));
    }
    assert_eq!(cuda_of_failure(&Failure::msg("no driver here")), None);
    assert_eq!(Error::Driver(root.clone()).cuda(), Some(&root));
    assert!(Error::Driver(root).failure().is_none());
}

#[test]
fn errors_say_what_was_wrong() {
    let e = Error::NoSuchDevice {
        ordinal: 3,
        count: 1,
    };
    assert_eq!(e.to_string(), "no CUDA device 3: the driver sees 1");
    assert!(e.cuda().is_none() && e.failure().is_none());
    let e = Error::InvalidArgument("a device needs at least one queue".into());
    assert!(e.to_string().contains("at least one queue"), "{e}");
    let e = Error::Driver(invalid_value());
    assert!(e.to_string().contains(cu_name!(cuMemsetD32Async)), "{e}");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn tracing_errors_carry_their_driver_error_and_say_tracing_once() {
    let root = launch_failed();
    let e = Error::from(cuhal_trace::Error::Driver(root.clone()));
    assert_eq!(e.cuda(), Some(&root));
    let text = e.to_string();
    assert_eq!(text.matches("tracing").count(), 1, "{text}");
    let e = Error::WrongDevice {
        what: "command buffer",
    };
    assert!(e.to_string().contains("command buffer"), "{e}");
    assert!(!e.to_string().starts_with("buffer"), "{e}");
}

#[test]
fn default_options_are_one_untraced_graph_queue() {
    let options = DeviceOptions::default();
    assert_eq!(options.queues, 1);
    assert_eq!(options.command_buffer_mode, CommandBufferMode::Graph);
    assert_eq!(CommandBufferMode::default(), CommandBufferMode::Graph);
    assert_eq!(options.tracing, Verbosity::Off);
    assert!(options.trace_sink.is_none());
    assert_eq!(
        options.completion.spin,
        cuhal::CompletionOptions::DEFAULT_SPIN
    );
    assert!(options.completion.gather > Duration::ZERO);
    let text = format!("{options:?}");
    assert!(
        text.contains("queues: 1") && text.contains("Graph"),
        "{text}"
    );
}

#[test]
fn wait_all_needs_every_semaphore() {
    let (a, b) = (Semaphore::new(0), Semaphore::new(5));
    let signaller = {
        let a = a.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.signal(2)
        })
    };
    let index = wait_semaphores(WaitMode::All, &[(&a, 2), (&b, 5)], Duration::from_secs(5));
    assert_eq!(index.unwrap(), 0);
    signaller.join().unwrap().unwrap();
    let start = Instant::now();
    let result = wait_semaphores(
        WaitMode::All,
        &[(&a, 2), (&b, 6)],
        Duration::from_millis(10),
    );
    assert!(
        matches!(
            result,
            Err(Error::Semaphore(cuhal_semaphore::Error::Timeout))
        ),
        "{result:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(10));
}

#[test]
fn wait_any_returns_the_entry_that_was_reached() {
    let sems: Vec<Semaphore> = (0..4).map(|_| Semaphore::new(0)).collect();
    let signaller = {
        let third = sems[2].clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            third.signal(9)
        })
    };
    let list: Vec<(&Semaphore, u64)> = sems.iter().map(|s| (s, 9)).collect();
    assert_eq!(
        wait_semaphores(WaitMode::Any, &list, Duration::from_secs(5)).unwrap(),
        2
    );
    signaller.join().unwrap().unwrap();
    assert!(matches!(
        wait_semaphores(WaitMode::Any, &[], Duration::ZERO),
        Err(Error::Semaphore(cuhal_semaphore::Error::EmptyWaitList))
    ));
}

#[test]
fn a_failure_ends_a_wait_with_that_failure() {
    let (a, b) = (Semaphore::new(0), Semaphore::new(0));
    let failure = Failure::new(Error::Driver(launch_failed()));
    let failer = {
        let (b, failure) = (b.clone(), failure.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            b.fail(failure)
        })
    };
    for mode in [WaitMode::All, WaitMode::Any] {
        let error = wait_semaphores(mode, &[(&a, 1), (&b, 1)], Duration::from_secs(5))
            .expect_err("b failed");
        assert!(
            error.failure().is_some_and(|f| f.ptr_eq(&failure)),
            "{error}"
        );
        assert_eq!(error.cuda(), Some(&launch_failed()));
    }
    failer.join().unwrap();
    assert!(matches!(a.query(), Ok(0)));
}
