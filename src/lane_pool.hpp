#pragma once
// A fixed set of threads that run one batch's lanes in parallel and join.

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace idemkafka::detail {

class LanePool {
public:
    explicit LanePool(std::size_t threads)
    {
        for (std::size_t i = 0; i < threads; ++i)
            threads_.emplace_back([this, i] { loop(i + 1); });
    }

    ~LanePool()
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            quit_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_)
            t.join();
    }

    LanePool(const LanePool&) = delete;
    LanePool& operator=(const LanePool&) = delete;

    /// Runs work(0) on the calling thread and work(1..n-1) on the pool's
    /// threads (n - 1 must not exceed their number); returns when all are done.
    /// `work` must not throw.
    void run(std::size_t n, const std::function<void(std::size_t)>& work)
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            work_ = &work;
            lanes_ = n;
            pending_ = n - 1;
            ++generation_;
        }
        wake_.notify_all();
        work(0);
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [this] { return pending_ == 0; });
        work_ = nullptr;
    }

private:
    void loop(std::size_t lane)
    {
        std::size_t seen = 0;
        for (;;) {
            const std::function<void(std::size_t)>* work = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
                if (quit_)
                    return;
                seen = generation_;
                if (lane >= lanes_)
                    continue;
                work = work_;
            }
            (*work)(lane);
            {
                std::lock_guard<std::mutex> lock(mu_);
                --pending_;
            }
            done_.notify_one();
        }
    }

    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(std::size_t)>* work_ = nullptr;
    std::size_t lanes_ = 0;
    std::size_t pending_ = 0;
    std::size_t generation_ = 0;
    bool quit_ = false;
    std::vector<std::thread> threads_;
};

} // namespace idemkafka::detail
