// Positive control: every legal order of the execution typestates compiles.
use tether::execution::state;
use tether::execution::{
    AnyExecution, Execution, ExecutionOutcome, NonReattachable, Producer, Reattachable,
    ResponseStream,
};

fn start_stream(e: Execution<state::Init, Reattachable>) -> (Execution<state::Streaming, Reattachable>, Producer, ResponseStream) {
    e.start()
}

fn reattach_and_release(e: &Execution<state::Streaming, Reattachable>) {
    let _ = e.reattach(Some("r"));
    let _ = e.release_until("r");
}

fn release_running(e: Execution<state::Streaming, Reattachable>) -> Execution<state::Cancelling, Reattachable> {
    e.release_all()
}

fn release_finished(e: Execution<state::Finishing, Reattachable>) -> Execution<state::Terminated, Reattachable> {
    e.release_all()
}

fn interrupt(e: Execution<state::Streaming, NonReattachable>) {
    match e.interrupt() {
        Ok(cancelling) => {
            let _ = cancelling.try_terminated();
        }
        Err(finishing) => {
            let _ = finishing.try_terminated();
        }
    }
}

fn after_interrupt(e: Execution<state::Cancelling, Reattachable>) -> bool {
    e.release_all()
}

async fn wait(e: Execution<state::Finishing, NonReattachable>) -> ExecutionOutcome {
    e.terminated().await.outcome()
}

fn erase(e: Execution<state::Streaming, Reattachable>) -> Result<Execution<state::Streaming, Reattachable>, AnyExecution<Reattachable>> {
    Execution::try_from(e.into_any())
}

fn cancel_before_start(e: Execution<state::Init, NonReattachable>) -> Execution<state::Terminated, NonReattachable> {
    e.interrupt()
}

fn main() {
    let _ = (start_stream, reattach_and_release, release_running, release_finished, interrupt);
    let _ = (after_interrupt, wait, erase, cancel_before_start);
}
