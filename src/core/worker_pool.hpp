#pragma once
// A fixed set of threads, one per worker, each running the work handed to it
// in the background of the poll thread; finished work waits in a completion
// queue until the poll thread takes it.

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
    /// `threads` workers; `finished` runs on a worker's thread each time its
    /// work ends, once the work is in the completion queue, under the pool's
    /// lock (so it has returned when wait_all() does). It must not throw nor
    /// call the pool.
    explicit WorkerPool(std::size_t threads, std::function<void()> finished = {})
        : finished_(std::move(finished)), slots_(threads)
    {
        for (std::size_t i = 0; i < threads; ++i)
            threads_.emplace_back([this, i] { loop(i); });
    }

    ~WorkerPool()
    {
        wait_all();
        {
            std::lock_guard<std::mutex> lock(mu_);
            quit_ = true;
        }
        for (auto& s : slots_)
            s.wake.notify_one();
        for (auto& t : threads_)
            t.join();
    }

    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    std::size_t threads() const noexcept { return threads_.size(); }

    /// Starts `work` on worker `n`'s thread and returns at once. The worker
    /// must be idle: never given work, or its last work taken by take_done().
    /// `work` must not throw.
    void submit(std::size_t n, std::function<void()> work)
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            slots_[n].work = std::move(work);
            slots_[n].state = State::running;
            ++busy_;
        }
        slots_[n].wake.notify_one();
    }

    /// True when worker `n` has work that was not taken back by take_done().
    bool busy(std::size_t n)
    {
        std::lock_guard<std::mutex> lock(mu_);
        return slots_[n].state != State::idle;
    }

    /// Workers given work and not taken back (running or finished).
    std::size_t busy_count()
    {
        std::lock_guard<std::mutex> lock(mu_);
        return busy_;
    }

    /// The workers whose work has finished since the last call, in the order
    /// they finished; each is idle again.
    std::vector<std::size_t> take_done()
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto out = std::move(done_);
        done_.clear();
        for (auto n : out)
            slots_[n].state = State::idle;
        busy_ -= out.size();
        return out;
    }

    /// Waits until some work has finished (and was not taken yet) or
    /// `deadline` passed; true when some has. At once when none is running.
    bool wait_any_until(std::chrono::steady_clock::time_point deadline)
    {
        std::unique_lock<std::mutex> lock(mu_);
        return finished_cv_.wait_until(lock, deadline, [this] { return !done_.empty() || busy_ == 0; }) &&
               !done_.empty();
    }

    /// Waits until worker `n`'s work has finished or `deadline` passed; true
    /// when it has (or it has none).
    bool wait_until(std::size_t n, std::chrono::steady_clock::time_point deadline)
    {
        std::unique_lock<std::mutex> lock(mu_);
        return finished_cv_.wait_until(lock, deadline, [&] { return slots_[n].state != State::running; });
    }

    /// Waits until no work runs (finished work may wait to be taken).
    void wait_all()
    {
        std::unique_lock<std::mutex> lock(mu_);
        finished_cv_.wait(lock, [this] { return running() == 0; });
    }

private:
    enum class State { idle, running, finished };
    struct Slot {
        State state = State::idle;
        std::function<void()> work;
        std::condition_variable wake;
    };

    std::size_t running() const
    {
        std::size_t n = 0;
        for (const auto& s : slots_)
            n += s.state == State::running ? 1 : 0;
        return n;
    }

    void loop(std::size_t n)
    {
        for (;;) {
            std::function<void()> work;
            {
                std::unique_lock<std::mutex> lock(mu_);
                slots_[n].wake.wait(lock, [&] { return quit_ || slots_[n].work; });
                if (quit_)
                    return;
                work = std::move(slots_[n].work);
                slots_[n].work = nullptr;
            }
            work();
            {
                std::lock_guard<std::mutex> lock(mu_);
                slots_[n].state = State::finished;
                done_.push_back(n);
                if (finished_)
                    finished_();
            }
            finished_cv_.notify_all();
        }
    }

    std::function<void()> finished_;
    std::mutex mu_;
    std::condition_variable finished_cv_;
    std::vector<Slot> slots_;
    std::vector<std::size_t> done_;
    std::size_t busy_ = 0;
    bool quit_ = false;
    std::vector<std::thread> threads_;
};

} // namespace idemkafka::detail
