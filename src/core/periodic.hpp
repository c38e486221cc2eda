#pragma once
// A thread that runs one piece of work now and again until stopped. Private to
// the library (MaintenanceRunner, the oldest-claim gauge, the fetch wake-up).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace idemkafka::detail {

/// Runs `tick` on a thread of its own: at once, then every `interval` (zero:
/// only when woken), and again soon after each wake(). stop() ends the wait
/// and joins after the running tick. `tick` must not throw.
class PeriodicThread {
public:
    PeriodicThread() = default;
    /// stop().
    ~PeriodicThread() { stop(); }
    PeriodicThread(const PeriodicThread&) = delete;
    PeriodicThread& operator=(const PeriodicThread&) = delete;

    /// Starts the thread; call once.
    void start(std::chrono::milliseconds interval, std::function<void()> tick)
    {
        interval_ = interval;
        tick_ = std::move(tick);
        thread_ = std::thread([this] { loop(); });
    }

    /// Runs the tick again once the current one (if any) is done; wakes that
    /// arrive meanwhile coalesce. Never blocks on the tick.
    void wake()
    {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            woken_ = true;
        }
        cv_.notify_one();
    }

    /// Idempotent; from the tick itself it only asks the loop to end.
    void stop() noexcept
    {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id())
            thread_.join();
    }

private:
    void loop() noexcept
    {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!stopping_) {
            woken_ = false;
            lock.unlock();
            tick_();
            lock.lock();
            const auto ready = [this] { return stopping_ || woken_; };
            if (interval_.count() > 0)
                cv_.wait_for(lock, interval_, ready);
            else
                cv_.wait(lock, ready);
        }
    }

    std::chrono::milliseconds interval_{0};
    std::function<void()> tick_;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    bool woken_ = false;
    std::thread thread_;
};

} // namespace idemkafka::detail
