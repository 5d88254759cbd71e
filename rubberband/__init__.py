"""Rubberband: elastic, sequentially consistent, successor-replicated storage on E-Cast
(dissertation chapter 4)."""
