#pragma once
// A fixed set of threads that run one batch's workers in parallel, in the
// background of the poll thread.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace idemkafka::detail {

class WorkerPool {
public:
    explicit WorkerPool(std::size_t threads)
    {
        for (std::size_t i = 0; i < threads; ++i)
            threads_.emplace_back([this, i] { loop(i); });
    }

    ~WorkerPool()
    {
        wait();
        {
            std::lock_guard<std::mutex> lock(mu_);
            quit_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_)
            t.join();
    }

    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    std::size_t threads() const noexcept { return threads_.size(); }

    /// Starts work(0..n-1), each on its own pool thread (n must not exceed
    /// threads()), and returns at once. The thread that finishes last calls
    /// `done` before wait() returns. Neither may throw. The previous start()
    /// must have been waited for.
    void start(std::size_t n, std::function<void(std::size_t)> work, std::function<void()> done = {})
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            work_ = std::move(work);
            done_cb_ = std::move(done);
            workers_ = n;
            pending_ = n;
            ++generation_;
        }
        wake_.notify_all();
    }

    /// Returns when the started work has finished (at once when none runs).
    void wait()
    {
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [this] { return pending_ == 0; });
    }

    /// Waits until the started work has finished or `deadline` passed;
    /// true when it has finished.
    bool wait_until(std::chrono::steady_clock::time_point deadline)
    {
        std::unique_lock<std::mutex> lock(mu_);
        return done_.wait_until(lock, deadline, [this] { return pending_ == 0; });
    }

private:
    void loop(std::size_t worker)
    {
        std::size_t seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
                if (quit_)
                    return;
                seen = generation_;
                if (worker >= workers_)
                    continue;
            }
            work_(worker); // work_ stays as it is until every worker has finished
            std::unique_lock<std::mutex> lock(mu_);
            if (--pending_ > 0)
                continue;
            if (done_cb_)
                done_cb_();
            done_.notify_all();
        }
    }

    std::mutex mu_;
    std::condition_variable wake_, done_;
    std::function<void(std::size_t)> work_;
    std::function<void()> done_cb_;
    std::size_t workers_ = 0;
    std::size_t pending_ = 0;
    std::size_t generation_ = 0;
    bool quit_ = false;
    std::vector<std::thread> threads_;
};

} // namespace idemkafka::detail
